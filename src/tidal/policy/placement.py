"""Gang placement with locality: all W devices at once, on the fewest nodes.

A gang that fits in one node goes on one node (best fit: the node with the fewest free devices that
still fits, so that whole nodes stay whole for large gangs); a larger gang takes ceil(n/M) nodes —
whole free nodes plus one best-fit node for the remainder — as Philly and the Helios simulator do.
"""

from __future__ import annotations

import functools
import itertools

from tidal.core import DeviceRef
from tidal.policy.state import SchedState


def fit_in_cluster(st: SchedState, cluster: str, n: int, guaranteed: bool = False) -> list[DeviceRef] | None:
    """Devices for a gang of ``n`` in ``cluster`` with the fewest nodes, or None if it cannot fit now.

    ``guaranteed``: among equally good nodes prefer one that already holds premium/standard work, so
    that guaranteed jobs pack together and other nodes keep only basic work, which a large guaranteed
    gang can take whole by preemption.
    """
    if n <= 0 or st.cluster_free[cluster] < n:
        return None
    m = st.cluster_m[cluster]
    b = st.buckets[cluster]
    if n <= m:
        node = _best_fit_guaranteed(st, b, n, m) if guaranteed else _best_fit(b, n, m)
        return None if node is None else [DeviceRef(node, i) for i in st.free_idx[node][:n]]
    whole, rest = divmod(n, m)
    full = b[m]
    if len(full) < whole:
        return None
    nodes = list(itertools.islice(full, whole))
    out = [DeviceRef(node, i) for node in nodes for i in range(m)]
    if rest:
        node = _best_fit(b, rest, m - 1)
        if node is None and len(full) > whole:
            node = next(itertools.islice(full, whole, None))
        if node is None:
            return None
        out.extend(DeviceRef(node, i) for i in st.free_idx[node][:rest])
    return out


def _best_fit(b: list[dict[str, None]], n: int, upto: int) -> str | None:
    for f in range(n, upto + 1):
        if b[f]:
            return next(iter(b[f]))
    return None


AFFINITY_SCAN = 8  # nodes looked at in a bucket for tier affinity: bounded on large clusters


def _best_fit_guaranteed(st: SchedState, b: list[dict[str, None]], n: int, upto: int) -> str | None:
    for f in range(n, upto + 1):
        if b[f]:
            for node in itertools.islice(b[f], AFFINITY_SCAN):
                nt = st.node_tier[node]
                if nt[1] or nt[2]:
                    return node
            return next(iter(b[f]))
    return None


def nodes_needed(st: SchedState, cluster: str, n: int) -> int:
    m = st.cluster_m[cluster]
    return -(-n // m)


@functools.lru_cache(maxsize=4096)
def useful_sizes(w: int, lo: int, hi: int) -> tuple[int, ...]:
    """Device counts worth running a W-rank job on, largest first: D = ceil(W/k) (replica splicing runs
    at 1/ceil(W/D) speed, so any D between two of these only wastes devices)."""
    out: list[int] = []
    k = 1
    while True:
        d = -(-w // k)
        if d < lo:
            break
        if d <= hi and (not out or d < out[-1]):
            out.append(d)
        if d == 1:
            break
        k += 1
    return tuple(out)
