"""Spilling: a lower-tier job that must give up its devices moves whole to another cluster with idle devices,
instead of being preempted, when the move pauses it briefly enough.

A preemption checkpoints the job and leaves it waiting until devices free up in a cluster it may run in: for
how long is unknown, and taken to be at least as long as the move's pause. A move checkpoints it the same way
and restores it at once on idle devices elsewhere; what it adds is the transfer of its image to the other
cluster, over the target nodes' links within a region and over the link from its region to the other's across
(:class:`~tidal.core.Links`, the view's; live, the rate measured from the one region to the other where there
is one). Both pay the checkpoint and the restore, so the rule weighs the transfer only, against a bound: a long
transfer may cost more than a wait for room that ends soon. The job moves when:
- it may run in another cluster: not pinned to its own (``home``); pinned to a region (``home_region``), it
  moves only within it;
- it fits whole there (on as many devices as it holds, on the fewest nodes) on idle devices, so that the move
  preempts nothing;
- the transfer of its image takes at most ``max_pause_s``: its image is ``image_gb`` where the view gives it
  (the simulator: its cost model's; live: its ranks' resident memory and GPU memory at the last heartbeat),
  else ``rank_image_gb`` per rank.
Among the clusters where it may move: the fewest nodes, then the shortest transfer, then the global level's
order (:func:`~tidal.policy.global_level.candidate_clusters`).
"""

from __future__ import annotations

from tidal.core import DeviceRef, Links
from tidal.policy.global_level import candidate_clusters
from tidal.policy.placement import fit_in_cluster
from tidal.policy.state import JobRec, SchedState


def image_gb(rec: JobRec, rank_image_gb: float) -> float:
    """The job's checkpoint image in GB: its own where known, else ``rank_image_gb`` per rank."""
    return rec.image_gb if rec.image_gb is not None else rec.W * rank_image_gb


def spill_target(st: SchedState, rec: JobRec, links: Links, *, max_pause_s: float,
                 rank_image_gb: float) -> tuple[str, list[DeviceRef], float] | None:
    """Where the running job ``rec`` may move instead of being preempted: (cluster, devices, estimated transfer
    in seconds), or None when no other cluster takes it whole on idle devices within ``max_pause_s``."""
    if len(st.cluster_names) < 2 or not rec.running or not rec.devices:
        return None
    here = st.node_cluster[rec.devices[0].node]
    region = st.cluster_region[here]
    n = len(rec.devices)
    gb = image_gb(rec, rank_image_gb)
    best: tuple[int, float, str, list[DeviceRef]] | None = None
    for c in candidate_clusters(st, rec):
        if c == here:
            continue
        devs = fit_in_cluster(st, c, n)
        if devs is None:
            continue
        nodes = len({d.node for d in devs})
        there = st.cluster_region[c]
        pause = links.transfer_s(gb, nodes, cross_region=there != region, regions=(region, there))
        if pause <= max_pause_s and (best is None or (nodes, pause) < best[:2]):
            best = (nodes, pause, c, devs)
    return None if best is None else (best[2], best[3], best[1])
