"""A user's submission, from the API to the job's row: checked against the user's projects and limits, then
admitted and stored (:mod:`tidal.control.submission`). The API commits submissions in shared transactions
(:class:`tidal.control.batches.Batcher`): :func:`accept` refuses before it writes anything, so a refused
submission leaves the others of its batch as they are."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from tidal.control import projects, submission, userlimits, users
from tidal.control.store.models import JobRow, Project, User
from tidal.core import JobSpec, JobState
from tidal.policy.admission import Quotas
from tidal.policy.sla_admission import SlaMode

#: ``Session.info`` key of the control plane's cache of who may submit under which project (see :func:`accept`).
ADMISSIONS = "admissions"
#: How long a user's account and membership of a project, once looked up, are taken as they were.
ADMISSION_TTL_S = 1.0
_MAX_ADMISSIONS = 10_000


def accept(s: Session, spec: JobSpec, owner: str, cause: str, *, quotas: Quotas | None = None,
           sla: SlaMode = "off") -> tuple[JobRow, str]:
    """A user's submission: under a project they belong to, within their limits and the project's (else
    refused, nothing written), then admitted and stored (:func:`tidal.control.submission.submit`).

    Where the control plane keeps a cache of admissions (``Session.info[ADMISSIONS]``, the API's), a user's
    account and project, once found to admit a submission, are taken as they were for
    :data:`ADMISSION_TTL_S`: a burst of one user's submissions looks them up once a second, not once each. A
    membership or limit an admin changes applies within that second (as a revoked token is refused)."""
    cache: dict[tuple[str, str], tuple[float, User, Project]] | None = s.info.get(ADMISSIONS)
    key = (owner, spec.project)
    hit = cache.get(key) if cache is not None else None
    t = time.monotonic()
    if hit is not None and t - hit[0] < ADMISSION_TTL_S:
        _, u, project = hit
    else:
        u = users.get(s, owner)
        project = projects.for_submission(s, u, spec.project)
        if cache is not None:
            if len(cache) >= _MAX_ADMISSIONS:
                cache.clear()
            cache[key] = (t, u, project)
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
