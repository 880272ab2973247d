"""Queue order: pending jobs kept sorted by a key fixed while they wait.

``PendingQueue`` is a sorted list (bisect): insert and remove are O(log n) searches plus a memmove,
iteration is in order. ``TieredFairQueue`` is Tidal's order, hierarchical as Slurm's fair tree: tiers
first (premium, standard, basic); within a tier, projects take turns by fair share (the project holding
the fewest devices per unit of weight goes next, as in DRF with one resource); within a project, users
take turns by equal shares (:class:`OwnerQueues`: the user holding the fewest devices goes next, so that
one user's thousand waiting jobs do not put another's single job behind them all); within a user's
jobs, a two-level least-attained-service order (jobs that have had little service first, as in
Tiresias) and then arrival — for the tiers in ``las_tiers``; the others are served in arrival order, so
that a long guaranteed job preempted by a higher tier resumes before newer work of its tier (its SLA
attainment is GPU-time weighted).

Usage is the devices held now (the policy's view), not a decayed history: the live control plane hands the
policy a fresh view every pass and the simulator the same events, so that both order alike from what they
see. Ties (the same devices held) go to the group whose next job has the lower sequence number (arrived
first), then by name.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator, Mapping

from tidal.policy.state import JobRec

Key = tuple[float, ...]


class PendingQueue:
    def __init__(self, key: Callable[[JobRec], Key]) -> None:
        self._key = key
        self._items: list[tuple[Key, int, str]] = []
        self._where: dict[str, tuple[Key, int, str]] = {}
        self._recs: dict[str, JobRec] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._where

    def add(self, rec: JobRec) -> None:
        if rec.id in self._where:
            self.remove(rec.id)
        item = (self._key(rec), rec.seq, rec.id)
        bisect.insort(self._items, item)
        self._where[rec.id] = item
        self._recs[rec.id] = rec

    def add_many(self, recs: list[JobRec]) -> None:
        """Add jobs not yet queued (a rebuild): one sort instead of an insertion each."""
        items = [(self._key(r), r.seq, r.id) for r in recs]
        self._items.extend(items)
        self._items.sort()
        for it, r in zip(items, recs, strict=True):
            self._where[r.id] = it
            self._recs[r.id] = r

    def remove(self, job_id: str) -> None:
        item = self._where.pop(job_id, None)
        if item is None:
            return
        i = bisect.bisect_left(self._items, item)
        del self._items[i]
        del self._recs[job_id]

    def __iter__(self) -> Iterator[JobRec]:
        # No copy (queues hold thousands): each step resumes after the last item yielded — where it still
        # is if nothing moved, else found by bisection — so that callers may start (remove) or preempt
        # (insert) jobs while iterating.
        items, recs = self._items, self._recs
        i = 0
        while i < len(items):
            item = items[i]
            yield recs[item[2]]
            i = i + 1 if i < len(items) and items[i] is item else bisect.bisect_right(items, item)

    def first(self) -> JobRec | None:
        return self._recs[self._items[0][2]] if self._items else None


def las_key(threshold: float, levels: int = 2, factor: float = 10.0) -> Callable[[JobRec], Key]:
    """Discretised LAS: ``levels`` queues split at ``threshold``, ``threshold × factor``, ... device-seconds
    of service, least served first, arrival order within a queue."""
    bounds = [threshold * factor**i for i in range(levels - 1)]

    def key(rec: JobRec) -> Key:
        a = rec.attained
        return (float(sum(1 for b in bounds if a >= b)), rec.submit)

    return key


def _merge(groups: Mapping[str, Iterator[JobRec]], usage: Mapping[str, int],
           weights: Mapping[str, float] | None = None) -> Iterator[JobRec]:
    """Interleave the groups' jobs (each iterator in its own order): the group with the fewest devices held
    (``usage``) per unit of weight goes next, ties to the next job that arrived first, then by name. A
    group's usage is read again after each of its jobs is yielded, as the caller may have started it."""
    heap: list[tuple[float, int, str]] = []
    heads: dict[str, JobRec] = {}
    its: dict[str, Iterator[JobRec]] = {}
    w = weights or {}
    for g in sorted(groups):
        it = groups[g]
        first = next(it, None)
        if first is not None:
            its[g] = it
            heads[g] = first
            heapq.heappush(heap, (usage.get(g, 0) / w.get(g, 1.0), first.seq, g))
    while heap:
        _, _, g = heapq.heappop(heap)
        yield heads.pop(g)
        nxt = next(its[g], None)
        if nxt is not None:
            heads[g] = nxt
            heapq.heappush(heap, (usage.get(g, 0) / w.get(g, 1.0), nxt.seq, g))


class OwnerQueues:
    """Waiting jobs of one group (a project's jobs of a tier, or the short lane) by owner, each owner's in
    ``key`` order; iterated with owners taking turns by the devices they hold (equal shares). With
    ``by_owner`` False every job is in one queue (``key`` order alone)."""

    def __init__(self, key: Callable[[JobRec], Key], by_owner: bool = True) -> None:
        self._key = key
        self._by_owner = by_owner
        self._q: dict[str, PendingQueue] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, rec: JobRec) -> bool:
        """Queue ``rec`` (again); whether it was not queued before."""
        o = rec.owner if self._by_owner else ""
        q = self._q.get(o)
        if q is None:
            q = self._q[o] = PendingQueue(self._key)
        new = rec.id not in q
        self._n += new
        q.add(rec)
        return new

    def add_many(self, recs: list[JobRec]) -> None:
        """Add jobs not yet queued (a rebuild), grouped per owner and sorted once."""
        groups: dict[str, list[JobRec]] = {}
        for rec in recs:
            groups.setdefault(rec.owner if self._by_owner else "", []).append(rec)
        for o, group in groups.items():
            q = self._q.get(o)
            if q is None:
                q = self._q[o] = PendingQueue(self._key)
            q.add_many(group)
            self._n += len(group)

    def remove(self, rec: JobRec) -> bool:
        q = self._q.get(rec.owner if self._by_owner else "")
        if q is not None and rec.id in q:
            q.remove(rec.id)
            self._n -= 1
            return True
        return False

    def __contains__(self, rec: object) -> bool:
        if not isinstance(rec, JobRec):
            return False
        q = self._q.get(rec.owner if self._by_owner else "")
        return q is not None and rec.id in q

    def iter(self, usage: Mapping[str, int]) -> Iterator[JobRec]:
        """Owners interleaved by the devices they hold (``usage``: owner → devices), re-read as the caller
        starts their jobs. Owners with nothing waiting are dropped here, before iterating, never during
        (a queue iterated on must stay the one a requeued job joins)."""
        qs = self._q
        if len(qs) > 1:
            for o in [o for o, q in qs.items() if not len(q)]:
                del qs[o]
        if len(qs) == 1:  # one user (or none): their queue as it is
            return iter(next(iter(qs.values())))
        return _merge({o: iter(q) for o, q in qs.items()}, usage)


class TieredFairQueue:
    def __init__(self, las_threshold: float, weights: Mapping[str, float] | None = None,
                 fair_share: bool = True, las_tiers: tuple[int, ...] = (0, 1, 2), las_levels: int = 2,
                 user_share: bool = True) -> None:
        las = las_key(las_threshold, las_levels)

        def fifo(rec: JobRec) -> Key:
            return (0.0, rec.submit)

        self._keys = [las if t in las_tiers else fifo for t in range(3)]
        self._weights = dict(weights or {})
        self._fair = fair_share
        self._users = user_share
        self._q: list[dict[str, OwnerQueues]] = [{}, {}, {}]  # tier rank → project → its users' queues
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _group(self, rec: JobRec) -> OwnerQueues:
        projects = self._q[rec.tier]
        p = rec.project if self._fair else ""
        q = projects.get(p)
        if q is None:
            q = projects[p] = OwnerQueues(self._keys[rec.tier], self._users)
        return q

    def add(self, rec: JobRec) -> None:
        self._n += self._group(rec).add(rec)

    def add_many(self, recs: list[JobRec]) -> None:
        """Add jobs not yet queued (a rebuild), grouped per queue and sorted once."""
        groups: dict[tuple[int, str], list[JobRec]] = {}
        for rec in recs:
            groups.setdefault((rec.tier, rec.project if self._fair else ""), []).append(rec)
        for group in groups.values():
            self._group(group[0]).add_many(group)
            self._n += len(group)

    def remove(self, rec: JobRec) -> bool:
        q = self._q[rec.tier].get(rec.project if self._fair else "")
        if q is not None and q.remove(rec):
            self._n -= 1
            return True
        return False

    def __contains__(self, rec: object) -> bool:
        if not isinstance(rec, JobRec):
            return False
        q = self._q[rec.tier].get(rec.project if self._fair else "")
        return q is not None and rec in q

    def has_tier(self, tier: int) -> bool:
        return any(len(q) for q in self._q[tier].values())

    def iter_tier(self, tier: int, usage: Mapping[str, int],
                  owner_usage: Mapping[str, int] | None = None) -> Iterator[JobRec]:
        """Jobs of one tier: projects interleaved by fair share (``usage``: project → devices held), and
        within each its users by the devices they hold (``owner_usage``), re-read as placements change
        them."""
        owners = owner_usage if owner_usage is not None else {}
        projects = [(p, q) for p, q in self._q[tier].items() if len(q)]
        if len(projects) == 1:
            return projects[0][1].iter(owners)
        return _merge({p: q.iter(owners) for p, q in projects}, usage, self._weights)


class TierQueues:
    """Waiting jobs by rank (higher served first) and by size, each sorted by ``key``.

    A scan of one rank merges its per-size queues in key order; once a job of size s failed to start
    (``limit(rank, s)``), queues of size ≥ s drop out of the merge, so a scan costs O(sizes + jobs
    started) rather than O(jobs waiting) when large gangs wait behind small free holes.
    """

    def __init__(self, key: Callable[[JobRec], Key], ranks: int = 3) -> None:
        self._key = key
        self._qs: list[dict[int, PendingQueue]] = [{} for _ in range(ranks)]
        self._where: dict[str, tuple[int, int]] = {}
        self._limit = [1 << 30] * ranks

    def __len__(self) -> int:
        return len(self._where)

    def add(self, rec: JobRec) -> None:
        self.remove(rec.id)
        q = self._qs[rec.tier].get(rec.W)
        if q is None:
            q = self._qs[rec.tier][rec.W] = PendingQueue(self._key)
        q.add(rec)
        self._where[rec.id] = (rec.tier, rec.W)

    def remove(self, job_id: str) -> None:
        tw = self._where.pop(job_id, None)
        if tw is not None:
            self._qs[tw[0]][tw[1]].remove(job_id)

    def begin_scan(self) -> None:
        self._limit = [1 << 30] * len(self._qs)

    def limit(self, tier: int, size: int) -> None:
        """A job of ``size`` could not start: skip jobs of ``tier`` at least that large in this scan."""
        self._limit[tier] = min(self._limit[tier], size)

    def tier(self, tier: int) -> Iterator[JobRec]:
        qs = self._qs[tier]
        # (queue item, size), items being unique; a size's next item is found when its head is taken, so
        # that a scan which stops early has not walked every size.
        heap = [(q._items[0], w) for w, q in qs.items() if q._items]
        heapq.heapify(heap)
        recs: dict[str, JobRec] = {}
        while heap:
            item, w = heapq.heappop(heap)
            if w >= self._limit[tier]:
                continue  # this size and larger cannot start now: drop the whole queue from the merge
            jid = item[2]
            q = qs[w]
            rec = q._recs.get(jid) or recs.get(jid)
            items = q._items
            i = bisect.bisect_right(items, item)
            if i < len(items):
                nxt = items[i]
                recs[nxt[2]] = q._recs[nxt[2]]
                heapq.heappush(heap, (nxt, w))
            if rec is not None:
                yield rec

    def __iter__(self) -> Iterator[JobRec]:
        for t in range(len(self._qs) - 1, -1, -1):
            for w in sorted(self._qs[t]):
                yield from self._qs[t][w]
