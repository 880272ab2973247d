"""New jobs: admission (quotas) and the job's row."""

from __future__ import annotations

import os
import secrets
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.history import record
from tidal.control.store.models import JobRow, NodeRow
from tidal.core import TERMINAL, JobSpec, JobState, Tier
from tidal.errors import ValidationError
from tidal.policy.admission import Quotas, decide


def submit(s: Session, spec: JobSpec, owner: str, cause: str,
           quotas: Quotas | None = None) -> tuple[JobRow, str]:
    """Returns the job and, if it was admitted at a lower tier than asked for, why. ``quotas``: a premium
    or standard job over its project's quota is admitted as basic (the spec keeps the tier asked for; the
    job's ``tier`` is the one admitted)."""
    if not os.path.isdir(spec.workdir):
        raise ValidationError(f"workdir {spec.workdir} does not exist", field="workdir",
                              hint="the working directory must exist at the same path on every node")
    tier, why = spec.tier, ""
    if quotas is not None and spec.tier is not Tier.BASIC:
        d = decide(quotas, _capacity(s), spec.project, spec.tier, spec.ranks, _guaranteed_use(s, spec.project))
        tier, why = d.tier, d.reason
    jid = secrets.token_hex(4)
    values: dict[str, Any] = dict(id=jid, name=spec.name, owner=owner, spec=spec.to_json(),
                                  tier=tier.value, ranks=spec.ranks, state=JobState.PENDING.value, held=False,
                                  submitted_at=now(s), restarts=0, attempt=0, placement=[])
    # A Core insert (no unit-of-work bookkeeping): submission is the hot path of the API. One cached
    # statement, the values as parameters; its submission number computed in the same statement.
    s.execute(_INSERT_JOB, values)
    record(s, "submitted", job_id=jid, cause=cause,
           detail=f"{spec.tier.value} job {spec.name!r} of {spec.ranks} rank(s) by {owner}"
                  + (f"; admitted as {tier.value}: {why}" if why else ""))
    return JobRow(**values), why


def _capacity(s: Session) -> int:
    return int(s.scalar(select(func.coalesce(func.sum(NodeRow.devices), 0))) or 0)


def _guaranteed_use(s: Session, project: str) -> int:
    """Devices asked for by the project's unfinished jobs admitted at a guaranteed tier. Two submissions
    racing on PostgreSQL may both count without the other (read committed): quotas are kept to within
    the jobs submitted at the same instant."""
    rows = s.execute(select(JobRow.ranks, JobRow.spec).where(
        JobRow.tier != Tier.BASIC.value, JobRow.state.not_in(tuple(t.value for t in TERMINAL))))
    return sum(ranks for ranks, spec in rows if (spec.get("project") or "default") == project)


_INSERT_JOB = insert(JobRow).values(
    seq=select(func.coalesce(func.max(JobRow.seq), 0) + 1).scalar_subquery())

