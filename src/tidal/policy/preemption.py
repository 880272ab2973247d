"""Making room for a waiting job: shrink elastic victims first, then preempt, lowest tier first.

Victims must be ``eligible`` (for Tidal: a strictly lower tier, so a higher tier is never preempted for
a lower one) and not protected: a job that was already preempted, moved or resized and has run less
than ``min_run_s`` since is left alone, which bounds preemption loops. Among eligible victims, the cheapest node wins:
fewest preempted jobs of the lowest tiers, shrinking before preempting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from tidal.core import DeviceRef
from tidal.policy.placement import useful_sizes
from tidal.policy.state import JobRec, SchedState


@dataclasses.dataclass
class Plan:
    shrinks: list[tuple[JobRec, list[DeviceRef]]]  # (victim, devices it keeps)
    victims: list[JobRec]  # preempted
    cost: tuple[float, ...]


@dataclasses.dataclass
class Outcome:
    plan: Plan | None
    wake: float | None  # when a protected victim becomes eligible (worth trying again then)


def make_room(
    st: SchedState,
    clusters: list[str],
    n: int,
    now: float,
    *,
    eligible: Callable[[JobRec], bool],
    order: Callable[[JobRec], tuple[float, ...]],
    min_run_s: float,
    shrink: bool,
    below_tier: int | None = None,
) -> Outcome:
    wake: list[float] = []

    def usable(j: JobRec) -> bool:
        if not eligible(j):
            return False
        # Anti-loop: a job already preempted, moved or resized keeps running at least ``min_run_s``
        # before it is disturbed again. A job on its first run is not protected: preempting it loses
        # nothing (checkpoint) and protecting every fresh start would let a stream of small basic jobs
        # keep a guaranteed gang off its node for ever.
        if (j.preemptions or j.moves) and now - j.last_change < min_run_s:
            wake.append(j.last_change + min_run_s)
            return False
        return True

    best: Plan | None = None
    for c in clusters:
        m = st.cluster_m[c]
        plan = (_room_on_node if n <= m else _room_on_nodes)(st, c, n, usable, order, shrink, below_tier)
        if plan is not None and (best is None or plan.cost < best.cost):
            best = plan
    return Outcome(best, min(wake) if best is None and wake else None)


SAMPLE = 4  # feasible nodes scored per attempt (like Kubernetes' percentageOfNodesToScore)
EXAMINE = 16  # nodes looked at per attempt at most: bounded work on a 10,000-node cluster


def _nodes_with_room(st: SchedState, cluster: str, n: int, below_tier: int | None) -> Iterator[str]:
    if below_tier is None or below_tier == 0:
        for b in st.buckets[cluster]:
            yield from b
        return
    room = st.room[below_tier][cluster]
    for v in range(n, len(room)):
        yield from room[v]  # no copy: the callers only read while iterating


def _room_on_node(
    st: SchedState, cluster: str, n: int, usable: Callable[[JobRec], bool],
    order: Callable[[JobRec], tuple[float, ...]], shrink: bool, below_tier: int | None,
) -> Plan | None:
    best: Plan | None = None
    found = 0
    for looked, node in enumerate(_nodes_with_room(st, cluster, n, below_tier)):
        if looked >= EXAMINE and best is not None:
            break
        if looked >= 4 * EXAMINE:
            break
        plan = _plan_node(st, node, n, usable, order, shrink)
        if plan is None:
            continue
        found += 1
        if best is None or plan.cost < best.cost:
            best = plan
            if not plan.victims and len(plan.shrinks) <= 1:
                return best
        if found >= SAMPLE:
            break
    return best


def _plan_node(
    st: SchedState, node: str, n: int, usable: Callable[[JobRec], bool],
    order: Callable[[JobRec], tuple[float, ...]], shrink: bool,
) -> Plan | None:
    load = list(st.load[node])
    free = load.count(0)
    if free >= n:
        return Plan([], [], (-1.0,))
    jobs = st.jobs
    cands = [j for j in map(jobs.__getitem__, st.node_jobs[node]) if usable(j)]
    if not cands:
        return None
    cands.sort(key=order)
    if not shrink:  # the common case, without the closure and bookkeeping shrinking needs
        return _preempt_on_node(node, n, load, free, cands, order)

    def drop(devs: list[DeviceRef]) -> int:
        got = 0
        for d in devs:
            if d.node == node:
                load[d.index] -= 1
                got += load[d.index] == 0
        return got

    shrinks: list[tuple[JobRec, list[DeviceRef]]] = []
    victims: list[JobRec] = []
    for j in cands:
        if free >= n:
            break
        d = len(j.devices)
        single = all(x.node == node for x in j.devices)
        if not single or d <= j.lo:
            continue
        need = n - free
        keep_n = next((s for s in useful_sizes(j.W, j.lo, d - 1) if d - s >= need), None)
        if keep_n is None:
            sizes = useful_sizes(j.W, j.lo, d - 1)
            if not sizes:
                continue
            keep_n = sizes[-1]
        keep = j.devices[:keep_n]
        free += drop(j.devices[keep_n:])
        shrinks.append((j, keep))
    if free < n:
        shrunk = {j.id: keep for j, keep in shrinks}
        for j in cands:
            if free >= n:
                break
            if j.id in shrunk:
                free += drop(shrunk.pop(j.id))
            else:
                free += drop(j.devices)
            victims.append(j)
        shrinks = [(j, k) for j, k in shrinks if j.id in shrunk]
    if free < n:
        return None
    top = max((order(v) for v in victims), default=(-1.0,))
    return Plan(shrinks, victims, (float(len(victims) > 0), *top, float(len(victims)), float(len(shrinks))))


def _preempt_on_node(node: str, n: int, load: list[int], free: int, cands: list[JobRec],
                     order: Callable[[JobRec], tuple[float, ...]]) -> Plan | None:
    """``_plan_node`` without shrinking (``free < n``): preempt ``cands`` in order until ``n`` are free."""
    victims: list[JobRec] = []
    for j in cands:
        if free >= n:
            break
        for d in j.devices:
            if d.node == node:
                left = load[d.index] - 1
                load[d.index] = left
                if left == 0:
                    free += 1
        victims.append(j)
    if free < n:
        return None
    top = max(map(order, victims))
    return Plan([], victims, (1.0, *top, float(len(victims)), 0.0))


def _room_on_nodes(
    st: SchedState, cluster: str, n: int, usable: Callable[[JobRec], bool],
    order: Callable[[JobRec], tuple[float, ...]], shrink: bool, below_tier: int | None,
) -> Plan | None:
    m = st.cluster_m[cluster]
    k = -(-n // m)
    scored: list[tuple[tuple[float, ...], str, list[JobRec]]] = []
    for node in st.buckets[cluster][m]:
        scored.append(((-1.0,), node, []))
        if len(scored) >= k:
            break
    if len(scored) < k:
        cands = (st.room[below_tier][cluster][m] if below_tier in (1, 2)
                 else (x for f in range(m - 1, -1, -1) for x in st.buckets[cluster][f]))
        extra = 0
        for node in list(cands):
            if st.node_size[node] < m or len(st.free_idx[node]) == m:
                continue
            occ = [st.jobs[j] for j in st.node_jobs[node]]
            if not all(usable(j) for j in occ):
                continue
            worst = max(order(j) for j in occ) if occ else (-1.0,)
            scored.append(((*worst, float(len(occ))), node, occ))
            extra += 1
            if len(scored) >= k and extra >= k + SAMPLE:
                break
    if len(scored) < k:
        return None
    scored.sort(key=lambda s: s[0])
    chosen = scored[:k]
    victims: dict[str, JobRec] = {}
    for _, _, occ in chosen:
        for j in occ:
            victims[j.id] = j
    vs = sorted(victims.values(), key=order)
    top = max((order(v) for v in vs), default=(-1.0,))
    return Plan([], vs, (float(len(vs) > 0), *top, float(len(vs)), 0.0))
