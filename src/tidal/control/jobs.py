"""A job's state in the control plane: its lifecycle and operation phase, its checkpoints and devices.

The modules beside this one act on jobs: :mod:`~tidal.control.submission` (new jobs),
:mod:`~tidal.control.launch` (starting ranks), :mod:`~tidal.control.checkpointing` (the checkpoint steps),
:mod:`~tidal.control.operations` (what agents' results do), :mod:`~tidal.control.failures` (ranks that end
or are lost), :mod:`~tidal.control.requests` (what users ask) and :mod:`~tidal.control.dispatch` (orders
to agents). Every function runs inside one :meth:`Database.tx` transaction. State changes go through the
core tables (:func:`tidal.core.advance` for the job, :func:`tidal.core.operations.step` for its
operation), so an invalid transition raises instead of corrupting the job, and each one is recorded as an
event with its cause. A job has at most one operation in flight (``op``); results of any other action, or
reports from an older attempt, are stale and ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import reasons
from tidal.control.clock import now
from tidal.control.dispatch import unstage
from tidal.control.history import record
from tidal.control.store.models import ActionRow, CheckpointRow, CheckpointState, JobRow, NodeRow
from tidal.core import TERMINAL, DeviceRef, JobSpec, JobState, advance
from tidal.core.operations import Phase, step
from tidal.errors import NotFound, named

S = JobState
# States in which the job's ranks exist (or are being created) on a node.
ACTIVE = frozenset({S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.RESTORING})


def state(job: JobRow) -> JobState:
    return JobState(job.state)


def spec_of(job: JobRow) -> JobSpec:
    """What the job's owner asked for, as stored at submission."""
    return JobSpec.from_json(job.spec)


def transition(s: Session, job: JobRow, new: JobState, cause: str | None, detail: str = "") -> str:
    advance(state(job), new, job=job.id)
    if new in TERMINAL:
        end_run(s, job)
    job.state = new.value
    reasons.clear(job)  # it no longer waits, or waits anew: the scheduler's next pass says why
    if new in TERMINAL:
        job.finished_at = now(s)
        job.target = None
        end_op(s, job)
        drop_actions(s, job.id)
    node = job.placement[0]["node"] if job.placement else None
    return record(s, new.value, job_id=job.id, node=node, cause=cause, detail=detail)


def end_run(s: Session, job: JobRow) -> None:
    """The job's ranks no longer hold its devices: the run's device-seconds since ``started_at`` join its
    attained service (as the simulator counts it: the checkpoint's pause included), where the ranks did run
    (a restore that never finished ran nothing)."""
    if job.placement and job.started_at is not None and state(job) in (S.RUNNING, S.CHECKPOINTING):
        ran = max(0.0, now(s) - job.started_at)
        job.attained_device_s = float(job.attained_device_s or 0.0) + device_count(job) * ran
    job.placement = []


def phase(job: JobRow) -> Phase:
    return Phase(job.phase) if job.phase is not None else Phase.IDLE


def set_phase(job: JobRow, new: Phase) -> None:
    """Step the job's operation to ``new`` through the phase table."""
    job.phase = step(phase(job), new, job=job.id)


def end_op(s: Session, job: JobRow) -> None:
    """The job's operation is over (done, failed, or abandoned with the job). Images prestaged for a restore
    it would have led to are dropped, wherever no restore is ordered yet (see
    :mod:`~tidal.control.prestaging`)."""
    staged = (job.opstate or {}).get("prestaged")
    if staged:
        unstage(s, job, staged["nodes"], int(staged["attempt"]))
    set_phase(job, Phase.IDLE)
    job.op = None
    job.op_purpose = None
    job.opstate = None


def busy(job: JobRow) -> str:
    if job.op_purpose in ("launch", "restore"):
        return "starting"
    if phase(job) is Phase.PRECOPY:
        return f"{job.op_purpose}: its last checkpoint is being copied to the target region's store"
    return (job.op_purpose and f"{job.op_purpose} checkpoint in progress") or job.state


def drop_actions(s: Session, job_id: str, kinds: Iterable[str] = ("launch", "restore", "checkpoint")) -> None:
    """Actions not yet done for the job will never matter again: their results become stale."""
    for a in s.scalars(select(ActionRow).where(ActionRow.job_id == job_id,
                                              ActionRow.status.in_(("pending", "sent")),
                                              ActionRow.kind.in_(tuple(kinds)))):
        a.status = "dropped"


def get(s: Session, job_id: str, *, owner: str | None) -> JobRow:
    """The job, if ``owner`` may see it (None: an admin sees every job). Others' jobs are 404: their
    existence is not disclosed."""
    job = s.get(JobRow, job_id)
    if job is None or (owner is not None and job.owner != owner):
        raise NotFound(f"no job {named(job_id)}", job=named(job_id))
    return job


# -- checkpoints ------------------------------------------------------------------------------------------
def checkpoints(s: Session, job_id: str) -> list[CheckpointRow]:
    """The job's checkpoints in the store, oldest first: committed ones, and bad ones kept for inspection."""
    return list(s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job_id,
                                                      CheckpointRow.retained.is_(True))
                          .order_by(CheckpointRow.created_at)))


def good(rows: Iterable[CheckpointRow]) -> list[CheckpointRow]:
    return [r for r in rows if r.state is CheckpointState.COMMITTED]


def parts_of(c: CheckpointRow) -> list[str]:
    """The store checkpoints holding a job checkpoint: one per node it spanned."""
    return list(c.parts or [c.id])


def restore_source(s: Session, job: JobRow) -> CheckpointRow | None:
    """The checkpoint the job resumes from: the one it was set to resume from, if still good, else its newest
    good one (None: it starts from scratch)."""
    ok = good(checkpoints(s, job.id))
    chosen = [r for r in ok if r.id == job.resume_from]
    return chosen[0] if chosen else (ok[-1] if ok else None)


def retired(rows: Sequence[CheckpointRow], keep: int, protect: str | None) -> list[CheckpointRow]:
    """Retention: of ``rows`` (oldest first), those to drop so that the newest ``keep`` good ones stay. Bad
    ones are kept for inspection and do not count; ``protect`` (the checkpoint the job resumes from) stays
    whatever its age."""
    ok = good(rows)
    return [r for r in ok[: max(0, len(ok) - keep)] if r.id != protect]


# -- devices ----------------------------------------------------------------------------------------------
def held_devices(job: JobRow) -> list[DeviceRef]:
    out = [DeviceRef(p["node"], int(p["device"])) for p in job.placement]
    out += [DeviceRef(n, int(i)) for n, i in job.target or ()]
    return out


def free_devices(s: Session, *, schedulable: bool = False) -> dict[str, list[int]]:
    """Free device indexes of every node that is up; ``schedulable``: of those not drained only (nothing new
    goes onto a drained node)."""
    nodes = select(NodeRow.name, NodeRow.devices).where(NodeRow.up.is_(True))
    if schedulable:
        nodes = nodes.where(NodeRow.drain.is_(None))
    free = {name: set(range(devices)) for name, devices in s.execute(nodes)}
    # Two columns, not whole rows: a reconcile pass asks this with hundreds of jobs running.
    held = select(JobRow.placement, JobRow.target).where(JobRow.state.in_([st.value for st in ACTIVE]))
    for placement, target in s.execute(held):
        for p in placement or ():
            free.get(p["node"], set()).discard(int(p["device"]))
        for n, i in target or ():
            free.get(n, set()).discard(int(i))
    return {n: sorted(v) for n, v in sorted(free.items())}


def jobs_on_devices(s: Session) -> dict[tuple[str, int], list[str]]:
    """(node, device index) → the ids of the jobs whose ranks run there now (several where jobs time-slice
    a device), in the order of their submission."""
    out: dict[tuple[str, int], list[str]] = {}
    active = select(JobRow.id, JobRow.placement).where(JobRow.state.in_([st.value for st in ACTIVE])).order_by(
        JobRow.seq)
    for jid, placement in s.execute(active):
        for key in dict.fromkeys((p["node"], int(p["device"])) for p in placement or ()):
            out.setdefault(key, []).append(jid)
    return out


def device_count(job: JobRow) -> int:
    return len({(p["node"], p["device"]) for p in job.placement})


def nodes_of(placement: Iterable[dict[str, Any]]) -> list[str]:
    """The nodes a job's ranks are on, in the order of their lowest rank."""
    out: list[str] = []
    for p in sorted(placement, key=lambda p: int(p["rank"])):
        if p["node"] not in out:
            out.append(p["node"])
    return out


def nodes_of_devices(devices: list[DeviceRef]) -> list[str]:
    return list(dict.fromkeys(d.node for d in devices))
