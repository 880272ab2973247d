"""Defragmentation: migrate small jobs off one node so that a waiting gang fits there.

Used when the cluster has enough free devices in total but no node has enough together. Only 1-device
jobs move (they fit in any free device elsewhere), at most ``max_moves`` of them, none of a higher tier
than the waiting job and none within its minimum run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal.core import ActionKind, DeviceRef
from tidal.policy.state import JobRec

if TYPE_CHECKING:
    from tidal.policy.base import BasePolicy


def defragment(
    pol: BasePolicy, rec: JobRec, n: int, cluster: str, now: float, *, max_moves: int, min_run_s: float
) -> list[DeviceRef] | None:
    st = pol.st
    assert st is not None
    m = st.cluster_m[cluster]
    if n > m or n < 2 or st.cluster_free[cluster] < n:
        return None
    best: tuple[int, str, list[JobRec]] | None = None
    for f in range(n - 1, 0, -1):  # nodes with the most free devices need the fewest moves
        need = n - f
        if need > max_moves:
            break
        for node in st.buckets[cluster][f]:
            if st.node_size[node] < n:
                continue
            movers = [
                st.jobs[j] for j in st.node_jobs[node]
                if len(st.jobs[j].devices) == 1 and not st.jobs[j].shared
                and st.jobs[j].tier <= rec.tier and now - st.jobs[j].last_change >= min_run_s
            ]
            if len(movers) < need:
                continue
            movers.sort(key=lambda j: (j.tier, -j.last_change))
            # The movers need free devices on other nodes of the cluster.
            if st.cluster_free[cluster] - f < need:
                continue
            best = (need, node, movers[:need])
            break
        if best is not None:
            break
    if best is None:
        return None
    _, node, movers = best
    st.node_down(node)  # hide the target node while the movers find new devices
    try:
        moves: list[tuple[JobRec, list[DeviceRef]]] = []
        for j in movers:
            b = st.buckets[cluster]
            dest = next((x for f in range(1, m + 1) for x in b[f]), None)
            if dest is None:
                return None
            devs = [DeviceRef(dest, st.free_idx[dest][0])]
            pol.move(j, devs, now, kind=ActionKind.MIGRATE, reason=f"defragment {node} for {rec.id}")
            moves.append((j, devs))
    finally:
        st.node_up(node)
    free = st.free_idx[node]
    if len(free) < n:
        return None
    return [DeviceRef(node, i) for i in free[:n]]
