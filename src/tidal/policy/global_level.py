"""The global level: which cluster (and so region) a job should go to.

Order: the job's home cluster only if it is pinned (virtual clusters, ``tidal submit --cluster``); the
clusters of its region if it is pinned to one (``--region``); otherwise clusters where the
gang fits on the fewest nodes, then the one holding its checkpoint (moving a checkpoint across clusters
or regions costs transfer time), then the region of its checkpoint, then the most free devices.
"""

from __future__ import annotations

from tidal.core import DeviceRef
from tidal.policy.placement import fit_in_cluster
from tidal.policy.state import JobRec, SchedState


def candidate_clusters(st: SchedState, rec: JobRec) -> list[str]:
    if rec.home is not None:
        return [rec.home] if rec.home in st.cluster_free else []
    if rec.home_region is not None:
        clusters = [c for c in st.cluster_names if st.cluster_region[c] == rec.home_region]
    elif len(st.cluster_free) == 1:
        return st.cluster_names
    else:
        clusters = list(st.cluster_free)
    home_region = st.cluster_region.get(rec.last_cluster) if rec.last_cluster else None

    def score(c: str) -> tuple[int, int, int, str]:
        return (
            0 if c == rec.last_cluster else 1,
            0 if home_region is None or st.cluster_region[c] == home_region else 1,
            -st.cluster_free[c],
            c,
        )

    return sorted(clusters, key=score)


def place(st: SchedState, rec: JobRec, n: int, *, affinity: bool = False) -> list[DeviceRef] | None:
    """Devices for ``n`` devices of ``rec`` in the best cluster that fits, or None. ``affinity``: pack
    guaranteed jobs together (Tidal's policy only; the baselines place as their papers do)."""
    clusters = candidate_clusters(st, rec)
    if len(clusters) == 1:
        return fit_in_cluster(st, clusters[0], n, guaranteed=affinity and rec.tier > 0)
    best: list[DeviceRef] | None = None
    best_nodes = 1 << 30
    for c in clusters:
        devs = fit_in_cluster(st, c, n, guaranteed=affinity and rec.tier > 0)
        if devs is not None:
            k = len({d.node for d in devs})
            if k < best_nodes:  # fewest nodes first; ties keep the earlier (preferred) cluster
                best, best_nodes = devs, k
                if k == 1:
                    break
    return best
