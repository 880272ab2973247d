"""New jobs: admission (quotas) and the job's row."""

from __future__ import annotations

import os
import secrets
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.history import record
from tidal.control.store.db import flush_behind, write_behind
from tidal.control.store.models import JobRow, NodeRow
from tidal.core import TERMINAL, JobSpec, JobState, Tier
from tidal.errors import Conflict, ValidationError
from tidal.policy.admission import Quotas, decide
from tidal.policy.reasons import Why
from tidal.policy.sla_admission import SlaMode, decide_sla, run_time_left


def submit(s: Session, spec: JobSpec, owner: str, cause: str,
           quotas: Quotas | None = None, sla: SlaMode = "off") -> tuple[JobRow, str]:
    """Returns the job and, if it was admitted at a lower tier than asked for, why (if it was deferred: its
    reason, ``deferred: ...``). ``quotas``: a premium
    or standard job over its project's quota is admitted as basic (the spec keeps the tier asked for; the
    job's ``tier`` is the one admitted). ``sla``: a premium or standard job that gives its run time, whose
    SLA the load cannot meet (:mod:`tidal.policy.sla_admission`, the simulator's rule), is demoted, or
    refused (:class:`~tidal.errors.Conflict`, with the estimate: nothing is kept), or deferred: kept held
    with the reason ``deferred``, released by :mod:`tidal.control.deferral` when the estimate meets the
    target. A job of a tier that has deferred jobs waiting is deferred behind them."""
    if not os.path.isdir(spec.workdir):
        raise ValidationError(f"workdir {spec.workdir} does not exist", field="workdir",
                              hint="the working directory must exist at the same path on every node")
    tier, why, deferred = spec.tier, "", ""
    if (quotas is not None or sla != "off") and spec.tier is not Tier.BASIC:
        flush_behind(s, _JOBS, _write_jobs)  # admission counts the jobs submitted before in this transaction
    if quotas is not None and spec.tier is not Tier.BASIC:
        d = decide(quotas, capacity(s), spec.project, spec.tier, spec.ranks, _guaranteed_use(s, spec.project))
        tier, why = d.tier, d.reason
    if sla != "off" and tier is not Tier.BASIC and spec.runtime is not None:
        backlog, demand = load(s)
        ahead = _deferred_at(s, tier) if sla == "defer" else 0
        a = decide_sla(sla, tier, spec.runtime, backlog, capacity(s), demand, spec.max_devices or spec.ranks, ahead)
        if a.outcome == "refused":
            raise Conflict(f"job not admitted: {a.reason.removeprefix('refused: ')}", field="tier",
                           estimate=round(a.estimate, 3),
                           hint="submit it later, at a lower tier, or without --runtime (admitted as asked)")
        if a.outcome == "demoted":
            tier, why = a.tier, "; ".join(x for x in (why, a.reason.removeprefix(f"accepted as {a.tier.value}: "))
                                          if x)
        if a.outcome == "deferred":
            deferred = a.reason
    jid = secrets.token_hex(4)
    values: dict[str, Any] = dict(id=jid, seq=_next_seq(s), name=spec.name, owner=owner, spec=spec.to_json(),
                                  tier=tier.value, ranks=spec.ranks, held=False,
                                  state=(JobState.HELD if deferred else JobState.PENDING).value,
                                  reason_code=Why.DEFERRED.value if deferred else None,
                                  reason=deferred or None,
                                  submitted_at=now(s), restarts=0, attempt=0, placement=[])
    # Written behind (no unit-of-work bookkeeping): submission is the hot path of the API, and a batch of them
    # is inserted in one statement at its commit.
    write_behind(s, _JOBS, _write_jobs, values)
    record(s, "submitted", job_id=jid, cause=cause,
           detail=f"{spec.tier.value} job {spec.name!r} of {spec.ranks} rank(s) by {owner}"
                  + (f"; admitted as {tier.value}: {why}" if why else "")
                  + (f"; {deferred}" if deferred else ""))
    if deferred:
        record(s, "waiting", job_id=jid, cause=cause, detail=deferred)
    return JobRow(**values), deferred or why


# A job deferred by admission against the load: it holds nothing and joins the load once released.
_DEFERRED = (JobRow.state == JobState.HELD.value) & (func.coalesce(JobRow.reason_code, "") == Why.DEFERRED.value)


def _deferred_at(s: Session, tier: Tier) -> int:
    """Deferred jobs of ``tier`` still waiting (a new job of the tier is deferred behind them)."""
    return int(s.scalar(select(func.count()).select_from(JobRow).where(
        JobRow.state == JobState.HELD.value, JobRow.reason_code == Why.DEFERRED.value,
        JobRow.tier == tier.value)) or 0)


def load(s: Session) -> tuple[dict[Tier, float], dict[Tier, int]]:
    """What unfinished jobs hold or ask for, per admitted tier: device-seconds of their run time left (the
    run time they gave, less the device-seconds they have run over their ranks, as the scheduler counts it:
    :func:`tidal.policy.sla_admission.run_time_left`) and devices. Deferred jobs are not counted: they join the
    backlog when they are released."""
    t = now(s)
    backlog = dict.fromkeys(Tier, 0.0)
    demand = dict.fromkeys(Tier, 0)
    rows = s.execute(select(JobRow.tier, JobRow.ranks, JobRow.spec, JobRow.state, JobRow.started_at,
                            JobRow.attained_device_s, JobRow.placement).where(
        JobRow.state.not_in(tuple(x.value for x in TERMINAL)), ~_DEFERRED))
    for tier_name, ranks, spec, state, started_at, attained, placement in rows:
        tier = Tier.parse(tier_name)
        devices = int((spec or {}).get("max_devices") or ranks)
        demand[tier] += devices
        runtime = (spec or {}).get("runtime")
        if runtime is not None:
            served = float(attained or 0.0)
            if state in RAN and started_at:
                served += len({(p["node"], p["device"]) for p in placement or ()}) * max(0.0, t - started_at)
            backlog[tier] += devices * (run_time_left(float(runtime), served, ranks) or 0.0)
    return backlog, demand


RAN = (JobState.RUNNING.value, JobState.CHECKPOINTING.value)  # states whose current run counts as service


def capacity(s: Session) -> int:
    return int(s.scalar(select(func.coalesce(func.sum(NodeRow.devices), 0))) or 0)


def _guaranteed_use(s: Session, project: str) -> int:
    """Devices asked for by the project's unfinished jobs admitted at a guaranteed tier, deferred ones not
    counted until they are released (as in the simulator, where they reach the quota then). Two submissions
    racing on PostgreSQL may both count without the other (read committed): quotas are kept to within
    the jobs submitted at the same instant."""
    rows = s.execute(select(JobRow.ranks, JobRow.spec).where(
        JobRow.tier != Tier.BASIC.value, JobRow.state.not_in(tuple(t.value for t in TERMINAL)), ~_DEFERRED))
    return sum(ranks for ranks, spec in rows if (spec.get("project") or "default") == project)


_INSERT_JOB = insert(JobRow)
_JOBS = "jobs"  # Session.info: the jobs a transaction writes behind
_NEXT_SEQ = "next_seq"  # Session.info: the transaction's own counter where the control plane keeps none


def _write_jobs(s: Session, rows: list[dict[str, Any]]) -> None:
    s.execute(_INSERT_JOB, rows)


#: ``Session.info`` key of the control plane's counter of submission numbers (``{"next": n}``), kept from one
#: transaction to the next where the control plane holds one (the API's); else each transaction reads the highest.
SEQ_COUNTER = "seq_counter"


def _next_seq(s: Session) -> int:
    """The next submission number: the highest stored, plus those given since (taken under the writers' lock, so
    no other transaction gives one meanwhile; a transaction that fails leaves a gap, which nothing minds)."""
    counter: dict[str, int] = s.info.get(SEQ_COUNTER) or s.info.setdefault(_NEXT_SEQ, {})
    seq = counter.get("next")
    if seq is None:
        seq = int(s.scalar(select(func.coalesce(func.max(JobRow.seq), 0))) or 0) + 1
    counter["next"] = seq + 1
    return seq

