"""Whether a job's ranks fit in the memory of the GPUs a placement puts them on.

Ranks spliced onto one device (D < W) share its GPU, each with its own memory: they may share it only if
the memory they use together fits in the GPU's. What one rank uses is measured on the job's nodes (the
most any rank of the job holds, NVML's figure); a rank alone on a GPU is held to the same rule, since a
rank that ran on a larger GPU may not fit a smaller one. A device with no GPU (a node of CPU devices), or a
job with no measured figure (it has not run on a GPU yet), has nothing to check.

Pure: the caller reads the placement, the figure and the GPUs' memory, and words the refusal with
:func:`describe`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from tidal.core import DeviceRef
from tidal.core.units import size


@dataclasses.dataclass(frozen=True, slots=True)
class GpuMemory:
    """The GPU of one device: its model and memory in bytes, as its node registered it."""

    model: str
    memory_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Misfit:
    """``ranks`` ranks of ``rank_bytes`` each on the GPU of ``node``'s device ``device``, which holds fewer
    than they need together."""

    node: str
    device: int
    model: str
    memory_bytes: int
    ranks: int
    rank_bytes: int

    @property
    def needed_bytes(self) -> int:
        return self.ranks * self.rank_bytes


def misfits(placement: Sequence[DeviceRef], rank_bytes: int | None,
            gpus: Mapping[DeviceRef, GpuMemory]) -> list[Misfit]:
    """The GPUs of ``placement`` (rank → device) whose ranks, ``rank_bytes`` each, need more memory than the
    GPU has, in the order the placement first names them; empty when everything fits, when ``rank_bytes``
    is unknown (None) or when the devices have no GPU (absent from ``gpus``)."""
    if rank_bytes is None or rank_bytes <= 0:
        return []
    out = []
    for device, ranks in Counter(placement).items():  # Counter keeps the order of first appearance
        gpu = gpus.get(device)
        if gpu is not None and ranks * rank_bytes > gpu.memory_bytes:
            out.append(Misfit(device.node, device.index, gpu.model, gpu.memory_bytes, ranks, rank_bytes))
    return out


def ranks_per_gpu(rank_bytes: int, memory_bytes: int) -> int:
    """How many ranks of ``rank_bytes`` fit together in ``memory_bytes`` (0: not even one)."""
    return memory_bytes // rank_bytes if rank_bytes > 0 else 0


def fewest_devices(ranks: int, rank_bytes: int, memory_bytes: int) -> int | None:
    """The fewest devices, each a GPU of ``memory_bytes``, on which ``ranks`` ranks of ``rank_bytes`` fit when
    spread evenly (as a placement packs them); None when one rank alone does not fit."""
    per = ranks_per_gpu(rank_bytes, memory_bytes)
    return -(-ranks // per) if per else None


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"


def describe(job_id: str, devices: int, found: Sequence[Misfit]) -> str:
    """Why job ``job_id`` cannot run on ``devices`` devices, with the numbers of the first GPU it does not
    fit (``found``: :func:`misfits`' answer, not empty)."""
    first = found[0]
    text = (f"job {job_id} cannot run on {_devices(devices)}: its ranks use up to {size(first.rank_bytes)} of "
            f"GPU memory each, and {first.ranks} of them on node {first.node}'s GPU {first.device} "
            f"({first.model}, {size(first.memory_bytes)}) {'needs' if first.ranks == 1 else 'need'} "
            f"{size(first.needed_bytes)}")
    if len(found) > 1:
        text += f" (and likewise on {len(found) - 1} other GPU(s))"
    return text
