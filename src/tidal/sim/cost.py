"""The cost model: how long a checkpoint, restore, migration or resize pauses a job.

Defaults come from Tidal's measurements (DESIGN.md §3) scaled to a GPU job, and are checked against
Singularity's published 16-GPU migrations (28–141 s including upload, Table 5):
- each rank's image is ``mem_per_rank_gb`` (device memory moved to host, plus CPU state);
- ranks dump in parallel, the ranks sharing a device one after another, at ``dump_gbps`` (CRIU measured
  ≈ 0.33 GB/s: a 1.3 GB image in ≈ 4 s) and restore at ``restore_gbps`` (≈ 0.33 GB/s: 3.9 s);
- images go to and come from the checkpoint store over each node's network link, ``net_gbps_per_node``
  (10 Gb/s = 1.25 GB/s), or ``cross_region_gbps`` in total between regions;
- ``fixed_s`` for the consistent cut, process-group teardown and rebuild.
A 16-rank job on 2 nodes: 2 + 18 + 38 (upload) + 38 (download) + 18 ≈ 115 s to migrate; 1 rank ≈ 51 s.
Time-slicing runs at ``timeslice_efficiency`` (Singularity Fig. 4: +1.4 … +5.6 % for 4 ranks on a GPU).
Preemption by kill loses the work since the job's last user-level checkpoint (every
``user_checkpoint_s``) and pays ``restart_s`` to start again from it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CostModel:
    mem_per_rank_gb: float = 6.0
    dump_gbps: float = 0.33
    restore_gbps: float = 0.33
    net_gbps_per_node: float = 1.25
    cross_region_gbps: float = 0.5
    fixed_s: float = 2.0
    timeslice_efficiency: float = 0.965
    user_checkpoint_s: float = 1800.0
    restart_s: float = 30.0
    start_s: float = 0.0  # a fresh start: the trace's durations already include it

    def _transfer(self, ranks: int, nodes: int, cross_region: bool) -> float:
        gb = ranks * self.mem_per_rank_gb
        t = gb / (max(nodes, 1) * self.net_gbps_per_node)
        if cross_region:
            t = max(t, gb / self.cross_region_gbps)
        return t

    def checkpoint_s(self, ranks: int, devices: int, nodes: int) -> float:
        per_device = -(-ranks // max(devices, 1))
        return self.fixed_s + per_device * self.mem_per_rank_gb / self.dump_gbps + self._transfer(ranks, nodes, False)

    def restore_s(self, ranks: int, devices: int, nodes: int, *, cross_region: bool = False) -> float:
        per_device = -(-ranks // max(devices, 1))
        return (self.fixed_s + per_device * self.mem_per_rank_gb / self.restore_gbps
                + self._transfer(ranks, nodes, cross_region))

    def rate(self, ranks: int, devices: int, sharers: int) -> float:
        """Progress per second relative to the job at full size on dedicated devices."""
        per_device = -(-ranks // devices)
        r = 1.0 / per_device
        if per_device > 1:
            r *= self.timeslice_efficiency
        if sharers > 1:
            r *= self.timeslice_efficiency / sharers
        return r
