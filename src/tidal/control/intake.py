"""A user's submission, from the API to the job's row: checked against the user's projects and limits, then
admitted and stored (:mod:`tidal.control.submission`). The API commits submissions in shared transactions
(:class:`tidal.control.batches.Batcher`): :func:`accept` refuses before it writes anything, so a refused
submission leaves the others of its batch as they are."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from tidal.control import projects, submission, userlimits, users
from tidal.control.store.models import JobRow
from tidal.core import JobSpec, JobState
from tidal.policy.admission import Quotas
from tidal.policy.sla_admission import SlaMode


def accept(s: Session, spec: JobSpec, owner: str, cause: str, *, quotas: Quotas | None = None,
           sla: SlaMode = "off") -> tuple[JobRow, str]:
    """A user's submission: under a project they belong to, within their limits and the project's (else
    refused, nothing written), then admitted and stored (:func:`tidal.control.submission.submit`)."""
    u = users.get(s, owner)
    project = projects.for_submission(s, u, spec.project)
    userlimits.admit(s, u, project)
    out = submission.submit(s, spec, owner, cause, quotas=quotas, sla=sla)
    userlimits.admitted(s, u, project)
    return out


def answer(s: Session, spec: JobSpec, owner: str, cause: str, *, quotas: Quotas | None = None,
           sla: SlaMode = "off") -> dict[str, Any]:
    """:func:`accept`, and what the submission route answers: the job's id, state, name and tier; and, where
    it was admitted otherwise than asked, how (deferred, or admitted at a lower tier, and why)."""
    job, why = accept(s, spec, owner, cause, quotas=quotas, sla=sla)
    out: dict[str, Any] = {"id": job.id, "state": job.state, "name": job.name, "tier": job.tier}
    if job.state == JobState.HELD.value and why.startswith("deferred: "):  # against the load: deferred
        out["deferred"] = why.removeprefix("deferred: ")
    elif why:  # over its project's quota, or against the load
        out["admitted_as"], out["admission"] = job.tier, why
    return out
