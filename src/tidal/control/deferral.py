"""Deferred jobs (TIDAL_ADMIT_SLA=defer): a premium or standard job whose expected attainment at its tier is
below the target at submission is stored held, with the reason ``deferred`` (the scheduler does not place
it), and released here, in submission order, when the estimate at its tier (:func:`tidal.policy.
sla_admission.release`, the simulator's rule) meets the target. Its run time joins the backlog only when it
is released: while it waits it holds no device and delays no one."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control.history import record
from tidal.control.jobs import spec_of
from tidal.control.store.models import JobRow
from tidal.control.submission import capacity, load
from tidal.core import JobState, Tier
from tidal.policy.reasons import Why
from tidal.policy.sla_admission import Deferred, Release, release

S = JobState


def _deferred(s: Session) -> list[JobRow]:
    q = select(JobRow).where(JobRow.state == S.HELD.value, JobRow.reason_code == Why.DEFERRED.value)
    return list(s.scalars(q.order_by(JobRow.seq)))


def due(s: Session) -> list[tuple[JobRow, Release]]:
    """The deferred jobs to release now, in submission order, each with its estimate."""
    rows = _deferred(s)
    if not rows:
        return []
    backlog, demand = load(s)
    waiting = []
    for j in rows:
        spec = spec_of(j)
        waiting.append(Deferred(j.id, Tier.parse(j.tier), float(spec.runtime or 0.0), spec.max_devices or j.ranks))
    by_id = {j.id: j for j in rows}
    return [(by_id[r.job_id], r) for r in release(waiting, backlog, capacity(s), demand)]


def release_due(s: Session, cause: str) -> list[str]:
    """Release the deferred jobs whose estimate now meets their target: each waits for the scheduler, an
    event ``released`` saying so with the estimate. Their ids."""
    out = []
    for job, r in due(s):
        job.state = S.PENDING.value  # held → pending: the lifecycle's release
        job.reason_code = job.reason = None  # the next pass says why it waits, if it does
        record(s, "released", job_id=job.id, cause=cause, detail=r.reason)
        out.append(job.id)
    return out
