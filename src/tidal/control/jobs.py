"""Job operations of the control plane: submission, user requests (preempt, resume, migrate, cancel),
the actions they dispatch to agents, and what the agents' results and exit reports do to a job.

Every function runs inside one :meth:`Database.tx` transaction. State changes go through the core
lifecycle table (:func:`tidal.core.advance`), so an invalid transition raises instead of corrupting the
job, and each one is recorded as an event with its cause. A job has at most one action in flight
(``op``); results of any other action, or reports from an older attempt, are stale and ignored.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from tidal.control.history import new_id, record
from tidal.control.store.models import ActionRow, CheckpointRow, JobRow, NodeRow, User
from tidal.core import TERMINAL, DeviceRef, JobSpec, JobState, advance
from tidal.errors import Conflict, NotFound, ValidationError

S = JobState
# States in which the job's ranks exist (or are being created) on a node.
ACTIVE = frozenset({S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.RESTORING})


def state(job: JobRow) -> JobState:
    return JobState(job.state)


def transition(s: Session, job: JobRow, new: JobState, cause: str | None, detail: str = "") -> str:
    advance(state(job), new, job=job.id)
    job.state = new.value
    if new in TERMINAL:
        job.finished_at = time.time()
        job.placement = []
        job.target = None
        job.op = None
        job.op_purpose = None
        drop_actions(s, job.id)
    node = job.placement[0]["node"] if job.placement else None
    return record(s, new.value, job_id=job.id, node=node, cause=cause, detail=detail)


def drop_actions(s: Session, job_id: str, kinds: Iterable[str] = ("launch", "restore", "checkpoint")) -> None:
    """Actions not yet done for the job will never matter again: their results become stale."""
    for a in s.scalars(select(ActionRow).where(ActionRow.job_id == job_id,
                                              ActionRow.status.in_(("pending", "sent")),
                                              ActionRow.kind.in_(tuple(kinds)))):
        a.status = "dropped"


# -- submission and lookup ------------------------------------------------------------------------------
def submit(s: Session, spec: JobSpec, owner: str, cause: str) -> JobRow:
    if not os.path.isdir(spec.workdir):
        raise ValidationError(f"workdir {spec.workdir} does not exist", field="workdir",
                              hint="the working directory must exist at the same path on every node")
    jid = secrets.token_hex(4)
    values: dict[str, Any] = dict(id=jid, name=spec.name, owner=owner, spec=spec_to_json(spec),
                                  tier=spec.tier.value, ranks=spec.ranks, state=S.PENDING.value, held=False,
                                  submitted_at=time.time(), restarts=0, attempt=0, placement=[])
    # A Core insert (no unit-of-work bookkeeping): submission is the hot path of the API. One cached
    # statement, the values as parameters; its submission number computed in the same statement.
    s.execute(_INSERT_JOB, values)
    record(s, "submitted", job_id=jid, cause=cause,
           detail=f"{spec.tier.value} job {spec.name!r} of {spec.ranks} rank(s) by {owner}")
    return JobRow(**values)


_INSERT_JOB = insert(JobRow).values(
    seq=select(func.coalesce(func.max(JobRow.seq), 0) + 1).scalar_subquery())


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "command": list(spec.command), "workdir": spec.workdir, "ranks": spec.ranks,
        "tier": spec.tier.value, "min_devices": spec.min_devices, "max_devices": spec.max_devices,
        "env": dict(spec.env), "checkpoint_every": spec.checkpoint_every, "max_restarts": spec.max_restarts,
        "owner": spec.owner, "project": spec.project,
    }


def get(s: Session, job_id: str, *, owner: str | None) -> JobRow:
    """The job, if ``owner`` may see it (None: an admin sees every job). Others' jobs are 404: their
    existence is not disclosed."""
    job = s.get(JobRow, job_id)
    if job is None or (owner is not None and job.owner != owner):
        raise NotFound(f"no job {job_id}", job=job_id)
    return job


def checkpoints(s: Session, job_id: str) -> list[CheckpointRow]:
    return list(s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job_id,
                                                      CheckpointRow.retained.is_(True))
                          .order_by(CheckpointRow.created_at)))


# -- devices ----------------------------------------------------------------------------------------------
def held_devices(job: JobRow) -> list[DeviceRef]:
    out = [DeviceRef(p["node"], int(p["device"])) for p in job.placement]
    out += [DeviceRef(n, int(i)) for n, i in job.target or ()]
    return out


def free_devices(s: Session) -> dict[str, list[int]]:
    """Free device indexes of every node that is up."""
    free = {n.name: set(range(n.devices)) for n in s.scalars(select(NodeRow).where(NodeRow.up.is_(True)))}
    for job in s.scalars(select(JobRow).where(JobRow.state.in_([st.value for st in ACTIVE]))):
        for d in held_devices(job):
            free.get(d.node, set()).discard(d.index)
    return {n: sorted(v) for n, v in sorted(free.items())}


# -- actions ------------------------------------------------------------------------------------------------
def new_action(s: Session, job: JobRow, node: str, kind: str, payload: dict[str, Any], cause: str | None,
               *, track: bool = True) -> ActionRow:
    a = ActionRow(id=new_id("a"), job_id=job.id, node=node, kind=kind, payload=payload, status="pending",
                  cause=cause, created_at=time.time())
    s.add(a)
    s.info["new_actions"] = True  # wakes the agents' long-polls at commit
    if track:
        job.op = a.id
    return a


def start(s: Session, job: JobRow, devices: list[DeviceRef], cause: str | None, keep: int) -> None:
    """Launch the job on ``devices`` (rank r on ``devices[r]``), or restore it there from its latest
    checkpoint when it has one."""
    nodes = {d.node for d in devices}
    if len(nodes) != 1:
        raise Conflict(f"job {job.id}: ranks spread over several nodes are not supported yet", job=job.id)
    (node,) = nodes
    restore = bool(checkpoints(s, job.id))
    how = "restoring from its latest checkpoint" if restore else "launching"
    detail = f"on {node} devices {[d.index for d in devices]}, {how}"
    job.placement = [{"rank": r, "node": d.node, "device": d.index, "pid": None}
                     for r, d in enumerate(devices)]
    job.target = None
    transition(s, job, S.RUNNING if state(job) is S.PENDING else S.RESTORING, cause, detail)
    job.attempt += 1
    noderow = s.get(NodeRow, node)
    cpus = noderow.cpus if noderow else []
    spec = job.spec
    owner = s.get(User, job.owner)
    payload = {
        "job_id": job.id, "attempt": job.attempt, "argv": spec["command"], "workdir": spec["workdir"],
        "env": spec["env"], "world_size": job.ranks, "keep": keep,
        # The ranks run under the owner's Unix account (the agent drops to it inside the rank).
        "unix_user": owner.unix_user if owner else None,
        "ranks": [{"rank": r, "device": d.index, "cpus": cpus[d.index] if d.index < len(cpus) else None}
                  for r, d in enumerate(devices)],
    }
    new_action(s, job, node, "restore" if restore else "launch", payload, cause)
    job.op_purpose = "restore" if restore else "launch"


def checkpoint(s: Session, job: JobRow, purpose: str, cause: str | None, keep: int) -> None:
    """Checkpoint a running job. ``purpose``: periodic (it continues), hold / preempt (stopped; a hold is
    not resumed automatically) or migrate (stopped, then restored on ``job.target``)."""
    if state(job) is not S.RUNNING or job.op is not None:
        raise Conflict(f"job {job.id} is busy ({_busy(job)}); try again in a moment", job=job.id, busy=True)
    node = job.placement[0]["node"]
    transition(s, job, S.CHECKPOINTING, cause, f"{purpose} checkpoint")
    then = "continue" if purpose == "periodic" else "kill"
    new_action(s, job, node, "checkpoint", {"job_id": job.id, "attempt": job.attempt, "then": then,
                                            "keep": keep}, cause)
    job.op_purpose = purpose


def _busy(job: JobRow) -> str:
    if job.op_purpose in ("launch", "restore"):
        return "starting"
    return (job.op_purpose and f"{job.op_purpose} checkpoint in progress") or job.state


# -- user requests ----------------------------------------------------------------------------------------
def preempt(s: Session, job: JobRow, cause: str, keep: int) -> None:
    """Checkpoint, release the devices and hold the job until ``resume``."""
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if st is S.PENDING:
        transition(s, job, S.HELD, cause, "held before it started")
    elif st is S.HELD or (st is S.PREEMPTED and job.held):
        return
    elif st is S.PREEMPTED:
        job.held = True
        record(s, "held", job_id=job.id, cause=cause)
    else:
        checkpoint(s, job, "hold", cause, keep)


def resume(s: Session, job: JobRow, cause: str) -> None:
    """Release a hold (a no-op on a job that is not held)."""
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if st is S.HELD:
        transition(s, job, S.PENDING, cause, "released")
    elif job.held:
        job.held = False
        record(s, "released", job_id=job.id, cause=cause)


def migrate(s: Session, job: JobRow, to: str | None, cause: str, keep: int) -> str:
    """Checkpoint the job, stop it and restore it on ``to`` (default: any other node with room)."""
    st = state(job)
    if st is not S.RUNNING or job.op is not None:
        if st in TERMINAL or st in (S.PENDING, S.HELD, S.PREEMPTED):
            raise Conflict(f"job {job.id} is not running (it is {job.state})", job=job.id, state=job.state)
        raise Conflict(f"job {job.id} is busy ({_busy(job)}); try again in a moment", job=job.id, busy=True)
    here = job.placement[0]["node"]
    free = free_devices(s)
    need = job.ranks
    if to is not None:
        if s.get(NodeRow, to) is None:
            raise NotFound(f"no node {to}", field="to", node=to)
        if to == here:
            raise Conflict(f"job {job.id} already runs on {to}", field="to", node=to)
        if to not in free:
            raise Conflict(f"node {to} is down", field="to", node=to)
        if len(free[to]) < need:
            raise Conflict(f"node {to} has {len(free[to])} free device(s); job {job.id} needs {need}",
                           field="to", node=to)
        dest = to
    else:
        fits = [n for n, idx in free.items() if n != here and len(idx) >= need]
        if not fits:
            raise Conflict(f"no other node has {need} free device(s) for job {job.id}",
                           hint="free some devices or add a node")
        dest = fits[0]
    job.target = [[dest, i] for i in free[dest][:need]]
    checkpoint(s, job, "migrate", cause, keep)
    return dest


def cancel(s: Session, job: JobRow, cause: str) -> None:
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    for node in {p["node"] for p in job.placement}:
        new_action(s, job, node, "kill", {"job_id": job.id, "attempt": job.attempt}, cause, track=False)
    transition(s, job, S.CANCELLED, cause)


# -- what agents report -------------------------------------------------------------------------------------
def on_result(s: Session, a: ActionRow, ok: bool, data: dict[str, Any], error: str | None, keep: int) -> None:
    job = s.get(JobRow, a.job_id)
    if job is None or a.kind == "kill" or job.op != a.id:
        return
    cause = a.id
    job.op = None
    purpose, job.op_purpose = job.op_purpose, None
    if a.kind in ("launch", "restore"):
        if not ok and a.kind == "restore":
            # Possibly transient (a node's disk, the store): try again, from the same checkpoint, as a restart.
            lost(s, job, cause, f"restore on {a.node} failed: {error}")
            return
        if not ok:
            job.error = error
            transition(s, job, S.FAILED, cause, f"{a.kind} failed: {error}")
            return
        pids = {int(r["rank"]): r["pid"] for r in data.get("ranks", [])}
        job.placement = [{**p, "pid": pids.get(int(p["rank"]))} for p in job.placement]
        job.started_at = time.time()
        if state(job) is S.RESTORING:
            transition(s, job, S.RUNNING, cause, f"restored, pids {sorted(pids.values())}")
        else:
            record(s, "started", job_id=job.id, node=a.node, cause=cause,
                   detail=f"pids {sorted(pids.values())}")
        return
    # a checkpoint
    if not ok:
        job.target = None
        transition(s, job, S.RUNNING, cause, f"{purpose} checkpoint failed, the job goes on: {error}")
        return
    ck = data["checkpoint"]
    s.add(CheckpointRow(id=ck["id"], job_id=job.id, created_at=ck["created_at"], bytes=ck["bytes"],
                        stored_bytes=ck["stored_bytes"], retained=True))
    kept = set(data.get("kept", ()))
    if kept:
        for row in s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job.id)):
            row.retained = row.id in kept or row.id == ck["id"]
    job.last_checkpoint_at = time.time()
    detail = f"checkpoint {ck['id']} ({ck['bytes']} bytes)"
    if purpose == "periodic":
        transition(s, job, S.RUNNING, cause, detail)
    elif purpose in ("hold", "preempt"):
        job.placement = []
        job.held = purpose == "hold"
        transition(s, job, S.PREEMPTED, cause, detail + (", held" if job.held else ""))
    elif not job.target:  # a migration whose destination was lost meanwhile: requeue it, not held
        job.placement = []
        job.target = None
        transition(s, job, S.PREEMPTED, cause, detail + ", its destination is gone: requeued")
    else:  # migrate
        job.placement = []
        target = [DeviceRef(n, int(i)) for n, i in job.target]
        eid = transition(s, job, S.MIGRATING, cause, detail + f", to {target[0].node}")
        start(s, job, target, eid, keep)


def on_exit(s: Session, job: JobRow, attempt: int, ranks: list[dict[str, Any]], cause: str,
            keep: int) -> bool:
    """The job's ranks exited on their own (or were killed from outside Tidal). False when stale."""
    if job.attempt != attempt or state(job) not in ACTIVE:
        return False
    codes = [r.get("code") for r in ranks]
    signals = [r.get("signal") for r in ranks if r.get("signal") is not None]
    if state(job) is S.CHECKPOINTING:
        transition(s, job, S.RUNNING, cause, "exited during a checkpoint")
    job.op = None
    job.op_purpose = None
    if signals:
        lost(s, job, cause, f"rank killed by signal {signals[0]} from outside Tidal")
        return True
    bad = [c for c in codes if c != 0]
    if bad:
        job.exit_code = int(bad[0]) if bad[0] is not None else 1
        transition(s, job, S.FAILED, cause, f"a rank exited with code {job.exit_code}")
    else:
        job.exit_code = 0
        transition(s, job, S.SUCCEEDED, cause, "every rank exited with code 0")
    return True


def lost(s: Session, job: JobRow, cause: str, why: str) -> None:
    """The job's ranks are gone (node lost, killed from outside): requeue it to be restored from its last
    committed checkpoint (or launched afresh without one), up to ``max_restarts`` times."""
    drop_actions(s, job.id)
    job.op = None
    job.op_purpose = None
    job.target = None
    limit = int(job.spec.get("max_restarts", 3))
    if job.restarts >= limit:
        job.error = why
        transition(s, job, S.FAILED, cause, f"{why}; no restarts left ({limit})")
        return
    job.restarts += 1
    has = bool(checkpoints(s, job.id))
    detail = f"{why}; restart {job.restarts}/{limit}, " + (
        "from the last checkpoint" if has else "from scratch")
    # Walk the lifecycle table back to a waiting state.
    st = state(job)
    if st is S.CHECKPOINTING:
        job.placement = []
        transition(s, job, S.PREEMPTED, cause, detail)
        return
    if st is S.MIGRATING:
        transition(s, job, S.RESTORING, cause, why)
        st = S.RESTORING
    if st is S.RESTORING:
        transition(s, job, S.RUNNING, cause, why)
    job.placement = []
    transition(s, job, S.PENDING, cause, detail)
