"""Why a job waits, kept with the job: the policy's reason (:mod:`tidal.policy.reasons`) stored on its row, and
an event recorded when the reason changes in kind (not at every change of a count in its text, so that a busy
cluster does not flood the event log)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tidal.control.history import record
from tidal.control.store.models import JobRow
from tidal.policy.reasons import Reason


def set_reason(s: Session, job: JobRow, reason: Reason, cause: str | None = None) -> None:
    if reason.why.value != job.reason_code:
        record(s, "waiting", job_id=job.id, cause=cause, detail=reason.text)
    if reason.why.value != job.reason_code or reason.text != job.reason:
        job.reason_code, job.reason = reason.why.value, reason.text


def clear(job: JobRow) -> None:
    """The job no longer waits (it starts, or it ended), or waits anew: the next pass says why."""
    job.reason_code = job.reason = None
