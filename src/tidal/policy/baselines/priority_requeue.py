"""Priority with preemption by kill and requeue: what Slurm (``PreemptMode=REQUEUE``) and Kueue
(``withinClusterQueue: LowerPriority``) do today.

Tiers are priorities. Pending jobs are ordered by priority, then submission (Kueue's
``BestEffortFIFO``: a job that does not fit is skipped, the ones behind it may start). A job that does
not fit may preempt strictly lower-priority running jobs — lowest priority first, then the most
recently started (Kueue's candidate order) — which are killed (no checkpoint: the work since the job's
own last checkpoint is lost, a parameter of the engine) and requeued. Neither system protects a job
by a minimum run time by default, so ``min_run_s`` is 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from tidal.policy.base import BasePolicy
from tidal.policy.global_level import candidate_clusters, place
from tidal.policy.preemption import make_room
from tidal.policy.queue_order import TierQueues
from tidal.policy.state import JobRec


class PriorityRequeue(BasePolicy):
    name = "priority-requeue"

    def __init__(self, min_run_s: float = 0.0) -> None:
        super().__init__()
        self.min_run_s = min_run_s
        # Per priority and size, so that a scan skips whole sizes that just failed to fit (same order).
        self.queue = TierQueues(_arrival)

    def on_rebuild(self, now: float) -> None:
        assert self.st is not None
        self.queue = TierQueues(_arrival)
        for rec in self.st.pending.values():
            self.queue.add(rec)

    def on_pending(self, rec: JobRec, now: float) -> None:
        self.queue.add(rec)

    def on_gone(self, rec: JobRec, now: float) -> None:
        self.queue.remove(rec.id)

    def _candidates(self, new: list[JobRec], freed: bool) -> Iterator[JobRec]:
        if freed:
            self.queue.begin_scan()
            for tier in (2, 1, 0):
                yield from self.queue.tier(tier)
        else:
            yield from sorted(new, key=lambda r: (-r.tier, r.submit, r.seq))

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        failed: dict[tuple[int, tuple[str, ...]], int] = {}
        wake: list[float] = []
        everywhere = tuple(st.cluster_names)
        for rec in self._candidates(new, freed):
            if rec.id not in st.pending:
                continue
            lower_busy = sum(st.tier_devices[: rec.tier]) > 0
            if st.free_total == 0 and not lower_busy:
                if freed:
                    break
                continue
            clusters = candidate_clusters(st, rec)
            memo = (rec.tier, tuple(clusters))
            if failed.get(memo, 1 << 30) <= rec.W:
                continue
            devs = place(st, rec, rec.W)
            if devs is None and lower_busy:
                tier = rec.tier
                out = make_room(
                    st, clusters, rec.W, now,
                    eligible=lambda j, tier=tier: j.tier < tier,  # type: ignore[misc]
                    order=lambda j: (float(j.tier), -j.started_at),
                    min_run_s=self.min_run_s, shrink=False, below_tier=tier,
                )
                if out.plan is not None:
                    for v in out.plan.victims:
                        self.preempt(v, now, kill=True, reason=f"requeued for {rec.id}")
                    devs = place(st, rec, rec.W)
                elif out.wake is not None:
                    wake.append(out.wake)
            if devs is not None:
                self.start(rec, devs, now)
            else:
                failed[memo] = min(failed.get(memo, 1 << 30), rec.W)
                if memo[1] == everywhere:
                    self.queue.limit(rec.tier, failed[memo])  # the jobs the memo skips: not even visited
        if wake:
            self._wakeup = min(wake)


def _arrival(rec: JobRec) -> tuple[float, ...]:
    return (rec.submit,)
