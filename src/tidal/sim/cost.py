"""The cost model: how long a checkpoint, restore, migration or resize pauses a job.

The rates and the fixed part are fitted from the mechanism's own benchmarks (``cost_fit.py``, written by
``benchmarks/policy_costfit.py`` from plain CRIU and Tidal resize measurements):
- the ranks of a node dump one after another (CRIU's dumps on a machine take turns), the nodes in parallel, at
  ``dump_gbps``; the devices are free once the dump is written (the upload to the store goes on from host
  memory);
- a restore fetches the job's images over its nodes' links (``net_gbps_per_node`` each, or
  ``cross_region_gbps`` in total between regions), then restores at ``restore_gbps``;
- ``fixed_s`` (each of checkpoint and restore) for the consistent cut, process-group teardown and rebuild,
  and fetch verification;
- a migration or resize is a checkpoint followed by a restore on the new devices; one whose ranks all stay on
  their one node restores from the images dumped there (no fetch; the commit after the job runs again), each
  step with ``local_fixed_s`` instead (:meth:`CostModel.local_move_s`).
A rank's image is the job's own size where the trace gives one (its model), else ``mem_per_rank_gb`` when
set, else the model-size distribution :func:`model_size_gb` (drawn per job, reproducibly).

GPU jobs (``gpu_mem_per_rank_gb`` > 0, ``tidal sim --gpu-mem-gb``): a rank's checkpoint image is its GPU
memory in use plus its host memory (the size above), because the device-state step copies the GPU's memory
to host memory, where CRIU dumps it with the rest. So a checkpoint first copies each rank's GPU memory to the
host at ``d2h_gbps`` (``--d2h-gbps``; the ranks sharing a GPU one after another), then dumps the whole image
as above; a restore fetches and restores the whole image, then copies the GPU part back at ``h2d_gbps``
(``--h2d-gbps``). The defaults are the rates measured on an H100 (:data:`DEFAULT_D2H_GBPS`); other GPUs and
drivers differ: measure with benchmarks/gpu_checkpoint.py and pass them. With no GPU memory (the default) the
costs are the CPU jobs' as before.
Time-slicing runs at ``timeslice_efficiency`` (docs/cluster.md: +5.5 % CPU work for 4 ranks on a device;
Singularity reports +1.4 … +5.6 %). Preemption by kill loses the work since the job's last user-level
checkpoint (every ``user_checkpoint_s``) and pays ``restart_s`` to start again from it.
"""

from __future__ import annotations

import dataclasses
import zlib

from tidal.errors import ValidationError
from tidal.sim import cost_fit

#: The copy rates of a GPU rank's memory when none is given (GB/s), as measured by benchmarks/gpu_checkpoint.py
#: on an NVIDIA H100 80GB (driver 580.159.04) with 40 GB of GPU memory: the driver's checkpoint copies it to the
#: process's host memory at 2.2 GB/s, its restore copies it back at 6.8 GB/s (far below the PCIe link's rate).
DEFAULT_D2H_GBPS = 2.2
DEFAULT_H2D_GBPS = 6.8

# Per-rank image (device memory in use: parameters, optimizer state, activations; plus host state) of a
# job whose trace names no model, in GB, with the share of jobs drawn at each size. An assumption, not a
# measurement: most jobs of a 2017–2020 GPU cluster are small vision and language models (a few GB),
# a tail fills a 16–32 GB device. Its mean, 6.2 GB, is the constant the model charged before.
MODEL_SIZE_GB: tuple[tuple[float, float], ...] = ((0.30, 2.0), (0.30, 4.0), (0.25, 8.0), (0.15, 16.0))

# Per-rank image by model family, for traces that name the model (Gavel's job types): the same estimate
# by the family's typical footprint on a 16 GB device.
MODEL_FAMILY_GB: dict[str, float] = {
    "ResNet-18": 2.0, "ResNet-50": 6.0, "Transformer": 8.0, "LM": 6.0, "Recommendation": 4.0,
    "CycleGAN": 4.0, "A3C": 1.0,
}


def model_size_gb(job_id: str) -> float:
    """A rank's image size for a job of unknown model: drawn from :data:`MODEL_SIZE_GB` by a hash of its id
    (the same job gets the same size in every run and under every policy)."""
    u = (zlib.crc32(job_id.encode()) & 0xFFFFFFFF) / 2**32
    acc = 0.0
    for share, gb in MODEL_SIZE_GB:
        acc += share
        if u < acc:
            return gb
    return MODEL_SIZE_GB[-1][1]


def family_size_gb(job_type: str) -> float | None:
    """A rank's image for a named model (``"ResNet-50 (batch size 64)"``), or None for an unknown one."""
    return MODEL_FAMILY_GB.get(job_type.split(" (")[0].strip())


@dataclasses.dataclass(frozen=True)
class CostModel:
    mem_per_rank_gb: float | None = None  # one size for every rank; None: the job's own or the distribution
    dump_gbps: float = cost_fit.DUMP_GBPS
    restore_gbps: float = cost_fit.RESTORE_GBPS
    net_gbps_per_node: float = cost_fit.NET_GBPS_PER_NODE
    cross_region_gbps: float = 0.5
    fixed_s: float = cost_fit.FIXED_S
    local_fixed_s: float = cost_fit.LOCAL_FIXED_S  # a step of a resize or move within one node
    timeslice_efficiency: float = 0.945
    user_checkpoint_s: float = 1800.0
    restart_s: float = 30.0
    start_s: float = 0.0  # a fresh start: the trace's durations already include it
    gpu_mem_per_rank_gb: float = 0.0  # GPU memory in use per rank (GB); 0: CPU jobs
    d2h_gbps: float = DEFAULT_D2H_GBPS  # device-to-host copy of a rank's GPU memory at a checkpoint (GB/s)
    h2d_gbps: float = DEFAULT_H2D_GBPS  # host-to-device copy back at a restore (GB/s)

    def __post_init__(self) -> None:
        for name in ("d2h_gbps", "h2d_gbps"):
            rate = getattr(self, name)
            if not rate > 0:
                raise ValidationError(f"{name} must be a rate above 0 GB/s, not {rate}", field=name)
        if not self.gpu_mem_per_rank_gb >= 0:
            raise ValidationError(f"gpu_mem_per_rank_gb must be 0 or more, not {self.gpu_mem_per_rank_gb}",
                                  field="gpu_mem_per_rank_gb")

    def mem_gb(self, job_id: str, own: float | None = None) -> float:
        """A rank's image size of job ``job_id`` (``own``: what its trace says)."""
        if self.mem_per_rank_gb is not None:
            return self.mem_per_rank_gb
        return own if own is not None else model_size_gb(job_id)

    def _m(self, mem_gb: float | None) -> float:
        if mem_gb is not None:
            return mem_gb
        return self.mem_per_rank_gb if self.mem_per_rank_gb is not None else 6.2

    def _gpu(self, gpu_gb: float | None) -> float:
        return self.gpu_mem_per_rank_gb if gpu_gb is None else gpu_gb

    def image_gb(self, mem_gb: float | None = None, gpu_gb: float | None = None) -> float:
        """A rank's checkpoint image: its host memory (``mem_gb``) plus its GPU memory in use (``gpu_gb``,
        default ``gpu_mem_per_rank_gb``), which the device-state step moves to the host before the dump."""
        return self._m(mem_gb) + self._gpu(gpu_gb)

    def _transfer(self, gb: float, nodes: int, cross_region: bool) -> float:
        t = gb / (max(nodes, 1) * self.net_gbps_per_node)
        if cross_region:
            t = max(t, gb / self.cross_region_gbps)
        return t

    def checkpoint_s(self, ranks: int, devices: int, nodes: int, mem_gb: float | None = None,
                     gpu_gb: float | None = None) -> float:
        """The pause of a checkpoint: per device, its ranks one after another copy their GPU memory to the
        host (``gpu_gb`` each at ``d2h_gbps``); then, per node, its ranks' images (host + GPU memory) are
        dumped one after another at ``dump_gbps`` (CRIU dumps on a machine take turns: the mechanism's
        DUMP_LOCK), the nodes in parallel."""
        return self.fixed_s + self._dump(ranks, devices, nodes, mem_gb, gpu_gb)

    def _dump(self, ranks: int, devices: int, nodes: int, mem_gb: float | None, gpu_gb: float | None) -> float:
        per_device = -(-ranks // max(devices, 1))
        per_node = -(-ranks // max(nodes, 1))
        g = self._gpu(gpu_gb)
        return per_device * g / self.d2h_gbps + per_node * self.image_gb(mem_gb, g) / self.dump_gbps

    def restore_s(self, ranks: int, devices: int, nodes: int, *, cross_region: bool = False,
                  mem_gb: float | None = None, gpu_gb: float | None = None) -> float:
        """The pause of a restore: the images are fetched over the nodes' links, then, per device, each rank's
        image is restored and its GPU memory copied back (``gpu_gb`` at ``h2d_gbps``)."""
        g = self._gpu(gpu_gb)
        image = self.image_gb(mem_gb, g)
        per_device = -(-ranks // max(devices, 1))
        return (self.fixed_s + self._transfer(ranks * image, nodes, cross_region)
                + per_device * (image / self.restore_gbps + g / self.h2d_gbps))

    def local_move_s(self, ranks: int, old_devices: int, new_devices: int, mem_gb: float | None = None,
                     gpu_gb: float | None = None) -> tuple[float, float]:
        """A resize or move whose ranks all stay on their one node: (checkpoint, restore). The ranks are dumped
        into the node's memory and restored from there, nothing fetched, each step with ``local_fixed_s``; the
        commit to the store goes on once the job runs again, off its pause."""
        g = self._gpu(gpu_gb)
        per_device = -(-ranks // max(new_devices, 1))
        return (self.local_fixed_s + self._dump(ranks, old_devices, 1, mem_gb, gpu_gb),
                self.local_fixed_s + per_device * (self.image_gb(mem_gb, g) / self.restore_gbps + g / self.h2d_gbps))

    def migration_s(self, ranks: int, devices: int, nodes: int, *, cross_region: bool = False,
                    mem_gb: float | None = None, gpu_gb: float | None = None) -> float:
        """A checkpoint on the old devices then a restore on ``devices`` (a resize is the same)."""
        return (self.checkpoint_s(ranks, devices, nodes, mem_gb, gpu_gb)
                + self.restore_s(ranks, devices, nodes, cross_region=cross_region, mem_gb=mem_gb, gpu_gb=gpu_gb))

    def rate(self, ranks: int, devices: int, sharers: int) -> float:
        """Progress per second relative to the job at full size on dedicated devices."""
        per_device = -(-ranks // devices)
        r = 1.0 / per_device
        if per_device > 1:
            r *= self.timeslice_efficiency
        if sharers > 1:
            r *= self.timeslice_efficiency / sharers
        return r
