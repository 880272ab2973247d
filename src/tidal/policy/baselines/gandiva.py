"""Gandiva (Xiao et al., OSDI'18): introspective scheduling with time-slicing, packing and migration.

- Tier-blind; jobs start in arrival order, and any job that fits starts (the "fit job first in FIFO
  order" of Gandiva's simulation in the Tiresias artifact): no head-of-line blocking.
- When a job does not fit, it is time-sliced (suspend/resume at mini-batch boundaries) on the devices of
  a running job of the same size ("affinity" to a node set of that size), at most 2 jobs a device —
  each then runs at half speed times the switching efficiency of the cost model.
- When devices free up, time-sliced jobs migrate to devices of their own ("grow-shrink" of the sharing).
- Migration to defragment: small jobs move so that a multi-device gang fits on one node.
- Not modelled: packing of jobs whose profiled GPU utilisation is low (the trace has no utilisation),
  and Gandiva's framework-integrated migration of "a second or two": the same engine charges every
  policy the same cost model for a checkpoint-based move.
Parameters: 2 jobs per device, min 300 s between moves of a job, at most 4 migrations a decision.
"""

from __future__ import annotations

from tidal.policy.singularity import Singularity, SingularityConfig

GANDIVA = SingularityConfig(
    min_run_s=300.0,
    las_threshold_device_s=float("inf"),  # arrival order
    fair_share=False,
    shrink=False,
    grow=False,
    elastic_start_fraction=1.0,
    defrag=True,
    max_migrations=4,
    time_slice=True,
    preempt=False,
    short_lane_device_s=0.0,  # arrival order only
)


class Gandiva(Singularity):
    name = "gandiva"
    tierless = True

    def __init__(self) -> None:
        super().__init__(GANDIVA)
