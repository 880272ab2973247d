"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional least-attained-service (2D-LAS).

A job's attained service is devices × time it has run. Jobs sit in K = 2 queues split at a threshold of
3,600 device-seconds (the paper finds two queues give most of the benefit; the threshold is ours: the
paper's value depends on its trace and is not published for Philly). Higher queues first, arrival order
within a queue. A waiting job of a higher queue preempts running jobs of a strictly lower queue
(latest arrival first); preemption is a checkpoint, charged by the engine's cost model. A job is demoted
the moment its service crosses the threshold (a wake-up, not a periodic scan). Starvation: a job
waiting longer than ``promote_knob`` × its last run time returns to the top queue (PromoteKnob = 8)
with its attained service reset. Jobs are placed consolidated like every policy here.

The queue a job is in is kept as its internal rank (top queue = 1, lower = 0), so that finding
lower-queue victims uses the same O(1) indexes as tier-based preemption.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from tidal.policy.base import BasePolicy
from tidal.policy.global_level import candidate_clusters, place
from tidal.policy.preemption import make_room
from tidal.policy.queue_order import TierQueues
from tidal.policy.state import JobRec

TOP, LOW = 1, 0


class Tiresias(BasePolicy):
    name = "tiresias"
    tierless = True

    def __init__(self, threshold_device_s: float = 3600.0, promote_knob: float = 8.0) -> None:
        super().__init__()
        self.threshold = threshold_device_s
        self.knob = promote_knob
        self.queue = TierQueues(self._key, ranks=2)
        self._timers: list[tuple[float, int, str]] = []  # demotions and promotions to check
        self._waiting_since: dict[str, tuple[float, float]] = {}  # id → (since, last run length)

    @staticmethod
    def _key(rec: JobRec) -> tuple[float, ...]:
        return (float(TOP - rec.tier), rec.submit)

    def _queue_of(self, rec: JobRec, now: float) -> int:
        return TOP if rec.service(now) < self.threshold - 1e-6 else LOW

    def on_rebuild(self, now: float) -> None:
        st = self.st
        assert st is not None
        self.queue = TierQueues(self._key, ranks=2)
        self._timers = []
        for rec in list(st.running.values()):
            st.retier(rec, self._queue_of(rec, now))
            self.on_changed(rec)
        for rec in st.pending.values():
            self.on_pending(rec, now)

    def on_pending(self, rec: JobRec, now: float) -> None:
        assert self.st is not None
        self.st.retier(rec, self._queue_of(rec, now))
        self.queue.add(rec)
        if rec.tier == LOW:
            last_run = max(now - rec.last_change, 1.0)
            self._waiting_since[rec.id] = (now, last_run)
            heapq.heappush(self._timers, (now + self.knob * last_run, rec.seq, rec.id))

    def on_gone(self, rec: JobRec, now: float) -> None:
        self.queue.remove(rec.id)
        self._waiting_since.pop(rec.id, None)

    def on_changed(self, rec: JobRec) -> None:
        if rec.running and rec.tier == TOP:
            when = rec.started_at + (self.threshold - rec.attained) / max(len(rec.devices), 1)
            heapq.heappush(self._timers, (when, rec.seq, rec.id))

    def _fire_timers(self, now: float) -> None:
        st = self.st
        assert st is not None
        while self._timers and self._timers[0][0] <= now + 1e-9:
            _, _, jid = heapq.heappop(self._timers)
            rec = st.jobs.get(jid)
            if rec is None:
                continue
            if rec.running:
                if rec.tier == TOP and rec.service(now) >= self.threshold - 1e-6:
                    st.retier(rec, LOW)  # demoted
                continue
            since = self._waiting_since.get(jid)
            if since is not None and rec.tier == LOW and now - since[0] >= self.knob * since[1] - 1e-9:
                self.queue.remove(jid)
                rec.attained = 0.0  # promoted to the top queue
                st.retier(rec, TOP)
                self.queue.add(rec)
                self._waiting_since.pop(jid, None)

    def _candidates(self, new: list[JobRec], freed: bool) -> Iterator[Iterator[JobRec]]:
        st = self.st
        assert st is not None
        for q in (TOP, LOW):
            if freed:
                if st.free_total == 0 and not (q == TOP and st.tier_devices[LOW] > 0):
                    return  # the scan would stop at its first job: skip building it
                yield self.queue.tier(q)
            else:
                yield iter(sorted((r for r in new if r.tier == q), key=lambda r: (r.submit, r.seq)))

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        self._fire_timers(now)
        failed: dict[tuple[int, tuple[str, ...]], int] = {}
        everywhere = tuple(st.cluster_names)
        self.queue.begin_scan()
        for jobs in self._candidates(new, freed):
            for rec in jobs:
                if rec.id not in st.pending:
                    continue
                q = rec.tier
                lower_busy = q == TOP and st.tier_devices[LOW] > 0
                if st.free_total == 0 and not lower_busy:
                    break
                clusters = candidate_clusters(st, rec)
                memo = (q, tuple(clusters))
                if failed.get(memo, 1 << 30) > rec.W:
                    devs = place(st, rec, rec.W)
                    if devs is None and lower_busy:
                        out = make_room(st, clusters, rec.W, now, eligible=_in_low_queue, order=_victim_order,
                                        min_run_s=0.0, shrink=False, below_tier=q)
                        if out.plan is not None:
                            for v in out.plan.victims:
                                self.preempt(v, now, reason=f"2D-LAS: {rec.id} has less service")
                            devs = place(st, rec, rec.W)
                    if devs is not None:
                        self.start(rec, devs, now)
                        continue
                    failed[memo] = min(failed.get(memo, 1 << 30), rec.W)
                if memo[1] == everywhere:
                    self.queue.limit(q, failed[memo])
        if self._timers:
            w = self._timers[0][0]
            self._wakeup = w if self._wakeup is None else min(self._wakeup, w)


# Victims for a job of the top queue (the only one that preempts): jobs of the lower queue, latest arrival
# first (module-level: no closure made per attempt).
def _in_low_queue(j: JobRec) -> bool:
    return j.tier < TOP


def _victim_order(j: JobRec) -> tuple[float, ...]:
    return (float(j.tier), -j.submit)
