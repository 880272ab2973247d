"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional least-attained-service (2D-LAS).

A job's attained service is devices × time it has run. Jobs sit in K = 2 queues split at a threshold of
3,600 device-seconds (the paper finds two queues give most of the benefit; the threshold is ours: the
paper's value depends on its trace and is not published for Philly). Higher queues first, arrival order
within a queue. A waiting job of a higher queue preempts running jobs of a strictly lower queue
(lowest first, latest arrival first); preemption is a checkpoint, charged by the engine's cost model.
Starvation: a job waiting longer than ``promote_knob`` × its last run time returns to the top queue
(PromoteKnob = 8) with its attained service reset. Jobs are placed consolidated like every policy here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from tidal.policy.base import BasePolicy
from tidal.policy.global_level import candidate_clusters, place
from tidal.policy.preemption import make_room
from tidal.policy.queue_order import PendingQueue
from tidal.policy.state import JobRec


class Tiresias(BasePolicy):
    name = "tiresias"
    tierless = True

    def __init__(self, threshold_device_s: float = 3600.0, promote_knob: float = 8.0) -> None:
        super().__init__()
        self.threshold = threshold_device_s
        self.knob = promote_knob
        self.queue = PendingQueue(self._key)
        self._timers: list[tuple[float, int, str]] = []  # demotions and promotions to check
        self._waiting_since: dict[str, tuple[float, float]] = {}  # id → (since, last run length)

    def qidx(self, rec: JobRec, now: float) -> int:
        return 0 if rec.service(now) < self.threshold else 1

    def _key(self, rec: JobRec) -> tuple[float, ...]:
        return (float(self.qidx(rec, 0.0)), rec.submit)

    def on_rebuild(self, now: float) -> None:
        assert self.st is not None
        self.queue = PendingQueue(self._key)
        self._timers = []
        for rec in self.st.pending.values():
            self.on_pending(rec, now)
        for rec in self.st.running.values():
            self.on_changed(rec)

    def on_pending(self, rec: JobRec, now: float) -> None:
        self.queue.add(rec)
        if rec.attained >= self.threshold:
            last_run = max(now - rec.last_change, 1.0)
            self._waiting_since[rec.id] = (now, last_run)
            heapq.heappush(self._timers, (now + self.knob * last_run, rec.seq, rec.id))

    def on_gone(self, rec: JobRec, now: float) -> None:
        self.queue.remove(rec.id)
        self._waiting_since.pop(rec.id, None)

    def on_changed(self, rec: JobRec) -> None:
        if rec.running and rec.attained < self.threshold:
            when = rec.started_at + (self.threshold - rec.attained) / max(len(rec.devices), 1)
            heapq.heappush(self._timers, (when, rec.seq, rec.id))

    def _fire_timers(self, now: float) -> None:
        st = self.st
        assert st is not None
        while self._timers and self._timers[0][0] <= now:
            _, _, jid = heapq.heappop(self._timers)
            rec = st.jobs.get(jid)
            if rec is None or rec.running:
                continue  # a demotion needs nothing but a rescan; the key is computed when compared
            since = self._waiting_since.get(jid)
            if since is not None and now - since[0] >= self.knob * since[1]:
                self.queue.remove(jid)
                rec.attained = 0.0  # promoted to the top queue
                self.queue.add(rec)
                self._waiting_since.pop(jid, None)
        if self._timers:
            self._wakeup = self._timers[0][0]

    def _candidates(self, new: list[JobRec], freed: bool) -> Iterator[JobRec]:
        if freed:
            yield from self.queue
        else:
            yield from sorted(new, key=lambda r: (self.qidx(r, 0.0), r.submit, r.seq))

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        self._fire_timers(now)
        failed: dict[tuple[int, tuple[str, ...]], int] = {}
        for rec in self._candidates(new, freed):
            if rec.id not in st.pending:
                continue
            q = self.qidx(rec, now)
            clusters = candidate_clusters(st, rec)
            memo = (q, tuple(clusters))
            if failed.get(memo, 1 << 30) <= rec.W:
                continue
            devs = place(st, rec, rec.W)
            if devs is None and q == 0:
                out = make_room(
                    st, clusters, rec.W, now,
                    eligible=lambda j: self.qidx(j, now) > q,
                    order=lambda j: (float(-self.qidx(j, now)), -j.submit),
                    min_run_s=0.0, shrink=False,
                )
                if out.plan is not None:
                    for v in out.plan.victims:
                        self.preempt(v, now, reason=f"2D-LAS: {rec.id} has less service")
                    devs = place(st, rec, rec.W)
            if devs is not None:
                self.start(rec, devs, now)
            else:
                failed[memo] = min(failed.get(memo, 1 << 30), rec.W)
            if st.free_total == 0 and (q > 0 or failed.get(memo, 1 << 30) <= 1) and rec.home is None:
                break  # nothing later in the queue can start or preempt
        if self._timers:
            w = self._timers[0][0]
            self._wakeup = w if self._wakeup is None else min(self._wakeup, w)
