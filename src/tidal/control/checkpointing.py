"""Checkpointing a running job, step by step through the operation phases (:mod:`tidal.core.operations`).

On one node, one order does it all (phase ``checkpoint``). Over several nodes it takes four steps, each an
order per node, each step on every node before the next: ``cut`` (every node says how many ops its ranks
have announced per communicator: process groups, point-to-point pairs), ``park`` (every rank runs to the
targets of a :class:`~tidal.core.cutplan.Plan` built from all nodes' counts and waits; a node whose ranks
need more answers with their needs, the targets are raised and another park round starts at once, until a
round raises nothing), ``dump`` (every rank drops its groups, is dumped and stored as that node's part; for
a stop it stays frozen), then ``finish``: once every part is stored and the job checkpoint committed, kill
the frozen ranks or let them all rebuild their groups and go on; if a step failed anywhere, let every rank
go on. docs/distributed.md argues why the cut ends and cannot deadlock.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tidal.control import prestaging
from tidal.control.clock import now
from tidal.control.dispatch import new_action
from tidal.control.history import new_id, record
from tidal.control.jobs import (
    busy,
    checkpoints,
    device_count,
    end_op,
    end_run,
    good,
    nodes_of,
    nodes_of_devices,
    parts_of,
    phase,
    retired,
    set_phase,
    state,
    transition,
)
from tidal.control.launch import start
from tidal.control.reasons import set_reason
from tidal.control.regionstores import regions_holding
from tidal.control.rendezvous import rendezvous
from tidal.control.store.models import ActionRow, CheckpointRow, CheckpointState, JobRow
from tidal.core import DeviceRef, JobState, protocol
from tidal.core.cutplan import Need, Plan
from tidal.core.operations import Phase
from tidal.core.units import size
from tidal.errors import Conflict
from tidal.policy import reasons

S = JobState


def checkpoint(s: Session, job: JobRow, purpose: str, cause: str | None, *,
               prestaged: dict[str, Any] | None = None) -> None:
    """Checkpoint a running job. ``purpose``: periodic (it continues), hold / preempt (stopped; a hold is
    not resumed automatically), migrate or resize (stopped, then restored on ``job.target``; into a region
    whose store lacks the job's last checkpoint, that is copied there first while the job runs:
    :func:`~tidal.control.prestaging.precopy`). ``prestaged``: what a pre-copy prestaged, for the restore."""
    if state(job) is not S.RUNNING or job.op is not None:
        raise Conflict(f"job {job.id} is busy ({busy(job)}); try again in a moment", job=job.id, busy=True)
    if purpose in ("migrate", "resize") and job.target and prestaged is None and prestaging.needs_precopy(s, job):
        prestaging.precopy(s, job, purpose, cause)
        return
    nodes = nodes_of(job.placement)
    transition(s, job, S.CHECKPOINTING, cause, f"{purpose} checkpoint")
    then: protocol.Then = "continue" if purpose == "periodic" else "kill"
    ck = _next_checkpoint_id(s, job)
    op = new_id("o")
    if len(nodes) == 1:
        set_phase(job, Phase.CHECKPOINT)
        job.opstate = {"checkpoint_id": ck}
        # Ranks that stay on this node (a resize, a move within it) are restored from the images dumped here;
        # when they all do, the node answers once they are dumped and the commit goes on behind the restore.
        targets = {n for n, _ in job.target or ()} if purpose in ("migrate", "resize") else set()
        new_action(s, job, nodes[0], protocol.Checkpoint(
            job_id=job.id, attempt=job.attempt, then=then, checkpoint_id=ck, keep_ids=_keep_ids(s, job, [ck]),
            rendezvous=rendezvous(s, job, ck), restore_here=nodes[0] in targets,
            commit_after=targets == {nodes[0]}, warm=prestaged is not None), cause, op=op)
    else:
        epoch = secrets.randbelow(1 << 48)
        set_phase(job, Phase.CUT)
        job.opstate = {"checkpoint_id": ck, "epoch": epoch, "then": then}
        for node in nodes:
            new_action(s, job, node, protocol.CutCounts(job_id=job.id, attempt=job.attempt, epoch=epoch),
                       cause, op=op)
    job.op_purpose = purpose
    if prestaged is not None:  # fetched by the pre-copy: the restore takes it there
        job.opstate = {**job.opstate, "prestaged": prestaged}
    elif purpose in ("migrate", "resize") and job.target:
        prestaging.order(s, job, cause)  # the targets fetch the last checkpoint meanwhile


def _next_checkpoint_id(s: Session, job: JobRow) -> str:
    n = s.scalar(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.job_id == job.id)) or 0
    return f"{n + 1:06d}-{secrets.token_hex(3)}"


def _keep_ids(s: Session, job: JobRow, new: list[str]) -> list[str]:
    """Store checkpoints an agent must keep when it applies retention: the parts of every checkpoint the
    control plane still lists (its newest ``keep`` good ones, the bad ones kept for inspection, the one
    it resumes from) and of the one being written. An agent retires a
    checkpoint only once it is no longer listed: the new one may never be committed (a part fails, the
    agent dies before its result arrives), and until it is, the oldest listed one is still a checkpoint
    of the job. So the store holds ``keep + 1`` checkpoints between a commit and the next checkpoint."""
    return [p for c in checkpoints(s, job.id) for p in parts_of(c)] + new


# -- the steps, as the agents' answers arrive ------------------------------------------------------------
def cut_done(s: Session, job: JobRow, group: list[ActionRow], failed: list[ActionRow], err: str,
             cause: str) -> None:
    assert job.opstate is not None
    if failed:
        _finish(s, job, "resume", cause, error=err)
        return
    results = [g.result or {} for g in group]
    if any(r.get("comms") is None for r in results):
        # An agent that counts the world group only (an older release): its one count, as before, unless
        # another node's ranks use other communicators, which that agent cannot park them at.
        others = sorted({k for r in results for k in r.get("comms") or {} if k != r.get("default")})
        if others:
            _finish(s, job, "resume", cause, error=f"the job uses sub-groups or point-to-point operations "
                    f"({others[0]}), which an agent of an older release on one of its nodes cannot cut; upgrade "
                    "its agents")
            return
        target = max((int(c) for r in results for c in r.get("counts", {}).values()), default=0)
        set_phase(job, Phase.PARK)
        job.opstate = {**job.opstate, "target": target}
        op = new_id("o")
        for node in nodes_of(job.placement):
            new_action(s, job, node, protocol.Park(job_id=job.id, attempt=job.attempt, epoch=job.opstate["epoch"],
                                                   target=target), cause, op=op)
        return
    plan = Plan.from_counts({k: (int(c["count"]), c["members"]) for k, c in r["comms"].items()} for r in results)
    default = next((r["default"] for r in results if r.get("default")), None)
    job.opstate = {**job.opstate, "default": default}
    _park_round(s, job, plan, cause)


def _park_round(s: Session, job: JobRow, plan: Plan, cause: str) -> None:
    """Send the plan's targets to every node (a park round at the plan's version)."""
    assert job.opstate is not None
    set_phase(job, Phase.PARK)
    default = job.opstate.get("default")
    job.opstate = {**job.opstate, "plan": plan.message(), "target": plan.target(default)}
    op = new_id("o")
    for node in nodes_of(job.placement):
        new_action(s, job, node, protocol.Park(
            job_id=job.id, attempt=job.attempt, epoch=job.opstate["epoch"], target=plan.target(default),
            targets=plan.targets, members=plan.members, version=plan.version), cause, op=op)


def _needs(result: dict[str, Any] | None) -> list[Need]:
    return [Need(str(n["key"]), tuple(int(m) for m in n["members"]), int(n["count"]))
            for n in (result or {}).get("needs") or ()]


def raised(s: Session, job: JobRow, a: ActionRow, cause: str) -> bool:
    """A node answered a park round: if its ranks need more than the targets, raise them and start the next
    round on every node at once (True). The other nodes' answers to this round are not awaited: their ranks
    may be waiting for the ranks that need more, and would never park at the old targets."""
    assert job.opstate is not None
    if a.status != "done" or "plan" not in job.opstate:
        return False
    plan = Plan.from_message(job.opstate["plan"])
    if not plan.raise_for(_needs(a.result)):
        return False
    for old in s.scalars(select(ActionRow).where(ActionRow.op == a.op, ActionRow.status == "pending")):
        old.status = "dropped"  # not sent yet: the next round supersedes it
    _park_round(s, job, plan, cause)
    return True


def parked(s: Session, job: JobRow, group: list[ActionRow], failed: list[ActionRow], err: str,
           cause: str) -> None:
    assert job.opstate is not None
    if failed:
        _finish(s, job, "resume", cause, error=err)
        return
    if "plan" in job.opstate and any(_needs(g.result) for g in group):
        # Needs that raised nothing (already covered): the ranks that sent them have not parked yet, so
        # another round at a new version, whose targets they reach.
        plan = Plan.from_message(job.opstate["plan"])
        plan.version += 1
        _park_round(s, job, plan, cause)
        return
    ck = job.opstate["checkpoint_id"]
    nodes = nodes_of(job.placement)
    parts = {n: f"{ck}.p{k}" for k, n in enumerate(nodes)}
    rdv = rendezvous(s, job, ck)
    set_phase(job, Phase.DUMP)
    job.opstate = {**job.opstate, "parts": list(parts.values()),
                   "rendezvous": protocol.encode(rdv) if rdv else None}
    op = new_id("o")
    then: protocol.Then = "continue" if job.opstate["then"] == "continue" else "hold"
    keep_ids = _keep_ids(s, job, list(parts.values()))
    holder = min(job.placement, key=lambda p: int(p["rank"]))["node"]
    for node in nodes:
        new_action(s, job, node, protocol.Checkpoint(
            job_id=job.id, attempt=job.attempt, then=then, checkpoint_id=parts[node], keep_ids=keep_ids,
            rendezvous=rdv, fs=node == holder,
            cut=protocol.Cut(epoch=job.opstate["epoch"], target=job.opstate["target"],
                             targets=(job.opstate.get("plan") or {}).get("targets"),
                             version=(job.opstate.get("plan") or {}).get("version", 0))), cause, op=op)


def dumped(s: Session, job: JobRow, group: list[ActionRow], failed: list[ActionRow], err: str, cause: str,
           keep: int) -> None:
    assert job.opstate is not None
    multi = phase(job) is Phase.DUMP
    if failed:
        if multi:
            _finish(s, job, "resume", cause, error=err)
        else:
            _failed(s, job, cause, err)
        return
    ck = job.opstate["checkpoint_id"]
    infos = [(g.result or {})["checkpoint"] for g in group]
    if not multi and (group[0].result or {}).get("committing"):
        _after_dump(s, job, ck, infos[0], cause)
        return
    _commit(s, job, ck, [i["id"] for i in infos], sum(int(i["bytes"]) for i in infos),
            sum(int(i["stored_bytes"]) for i in infos), max(float(i["created_at"]) for i in infos), keep)
    if multi:
        _finish(s, job, "resume" if job.opstate["then"] == "continue" else "kill", cause)
        return
    _after_commit(s, job, cause)


def finished(s: Session, job: JobRow, cause: str) -> None:
    assert job.opstate is not None
    if job.opstate.get("error"):
        _failed(s, job, cause, job.opstate["error"])
        return
    _after_commit(s, job, cause)


def _finish(s: Session, job: JobRow, then: Literal["kill", "resume"], cause: str, **state_: Any) -> None:
    """The last step over several nodes: kill the held ranks, or let every rank go on. After the dump
    step every rank builds a new group (on the same keys everywhere), else the gates just open."""
    assert job.opstate is not None
    rebuild = phase(job) is Phase.DUMP
    set_phase(job, Phase.FINISH)
    job.opstate = {**job.opstate, "finish": then, **state_}
    op = new_id("o")
    rdv = job.opstate.get("rendezvous") if rebuild else None
    for node in nodes_of(job.placement):
        new_action(s, job, node, protocol.Finish(
            job_id=job.id, attempt=job.attempt, then=then, rebuild=rebuild,
            rendezvous=protocol.Rendezvous(**rdv) if rdv else None), cause, op=op)


def _commit(s: Session, job: JobRow, ck: str, parts: list[str], nbytes: int, stored: int, created: float,
            keep: int) -> None:
    """The job checkpoint exists from here on: every part is stored. Older ones beyond ``keep`` are no
    longer retained (the agents delete their parts from the store)."""
    s.add(CheckpointRow(id=ck, job_id=job.id, created_at=created, bytes=nbytes, stored_bytes=stored,
                        retained=True, parts=parts, state=CheckpointState.COMMITTED,
                        regions=regions_holding(s, nodes_of(job.placement))))
    s.flush()
    _counts(s, job, keep)
    job.opstate = {**(job.opstate or {}), "committed": ck, "detail": f"checkpoint {ck} ({size(nbytes)}"
                   + (f", {len(parts)} parts)" if len(parts) > 1 else ")")}


def _counts(s: Session, job: JobRow, keep: int) -> None:
    """A checkpoint of the job was just committed: older ones beyond ``keep`` are retired, and the job goes on
    from it (no longer from one it was set to resume from)."""
    for row in retired(checkpoints(s, job.id), keep, job.resume_from):
        row.retained = False
    job.resume_from = None
    job.last_checkpoint_at = now(s)


def _after_dump(s: Session, job: JobRow, ck: str, info: dict[str, Any], cause: str) -> None:
    """A resize or a move within the job's node, answered once dumped: the checkpoint is recorded as
    committing (no fallback yet, nothing retired for it) and the job restored there from its images at once;
    :func:`commit_reported` settles it."""
    row = CheckpointRow(id=ck, job_id=job.id, created_at=float(info["created_at"]), bytes=int(info["bytes"]),
                        stored_bytes=0, retained=True, parts=[str(info["id"])], state=CheckpointState.COMMITTING,
                        regions=regions_holding(s, nodes_of(job.placement)))
    s.add(row)
    s.flush()
    job.opstate = {**(job.opstate or {}), "detail": f"checkpoint {ck} dumped ({size(int(info['bytes']))}, being "
                                                    "committed)"}
    _after_commit(s, job, cause, source=row)


def commit_reported(s: Session, job_id: str, ck: str, ok: bool, nbytes: int, stored: int, error: str | None,
                    node: str, keep: int) -> bool:
    """The end of the commit of checkpoint ``ck``, dumped before its job was restored from its images: it is
    the job's checkpoint from now on (older ones beyond ``keep`` retired), or, failed, it is removed and the
    job's older committed checkpoint stays the one to fall back to (the job runs on). False when there is no
    such checkpoint being committed (a report sent again, or one for a checkpoint given up)."""
    row = s.get(CheckpointRow, ck)
    job = s.get(JobRow, job_id)
    if row is None or job is None or row.job_id != job_id or row.state is not CheckpointState.COMMITTING:
        return False
    if ok:
        row.state, row.bytes, row.stored_bytes = CheckpointState.COMMITTED, nbytes, stored
        _counts(s, job, keep)
        record(s, "committed", job_id=job.id, node=node,
               detail=f"checkpoint {ck} committed ({size(nbytes)}, {size(stored)} new) while the job ran on from "
                      "its images")
        return True
    s.delete(row)
    fallback = good(checkpoints(s, job.id))
    record(s, "checkpoint_failed", job_id=job.id, node=node,
           detail=f"checkpoint {ck} was not committed ({error}): the job runs on from the images it was restored "
                  "from; " + (f"checkpoint {fallback[-1].id} stays the one to fall back to" if fallback
                              else "it has no checkpoint to fall back to yet"))
    return True


def _failed(s: Session, job: JobRow, cause: str, err: str) -> None:
    purpose = job.op_purpose
    end_op(s, job)
    job.target = None
    transition(s, job, S.RUNNING, cause, f"{purpose} checkpoint failed, the job goes on: {err}")


def _after_commit(s: Session, job: JobRow, cause: str, source: CheckpointRow | None = None) -> None:
    purpose = job.op_purpose
    detail = (job.opstate or {}).get("detail", "checkpoint")
    if purpose in ("migrate", "resize") and job.target:
        prestaging.keep(job, list(prestaging.moving(job)))  # the restore below uses what they fetched
    end_op(s, job)
    if purpose == "periodic":
        transition(s, job, S.RUNNING, cause, detail)
    elif purpose in ("hold", "preempt"):
        end_run(s, job)
        job.held = purpose == "hold"
        eid = transition(s, job, S.PREEMPTED, cause, detail + (", held" if job.held else ""))
        if job.held:
            set_reason(s, job, reasons.held(), eid)
    elif not job.target:  # a migration whose destination was lost meanwhile: requeue it, not held
        end_run(s, job)
        job.target = None
        transition(s, job, S.PREEMPTED, cause, detail + ", its destination is gone: requeued")
    else:  # migrate or resize
        before = device_count(job)
        end_run(s, job)
        target = [DeviceRef(n, int(i)) for n, i in job.target]
        where = f", to {', '.join(nodes_of_devices(target))}"
        if purpose == "resize":
            where += f" on {len(set(target))} device(s) (was {before})"
        eid = transition(s, job, S.MIGRATING, cause, detail + where)
        if purpose == "migrate":
            _keep_pin(s, job, len(set(target)), eid)
        start(s, job, target, eid, source=source)


def _keep_pin(s: Session, job: JobRow, devices: int, cause: str) -> None:
    """A job pinned to D devices (``tidal resize``) that a migration moved onto another number of devices (one
    of ranks sharing a device moved away) stays pinned, to the devices it runs on now: a pin it no longer
    keeps would be undone, unasked, by its next restore."""
    if job.pinned_devices and job.pinned_devices != devices:
        before, job.pinned_devices = job.pinned_devices, devices
        record(s, "resize_pinned", job_id=job.id, cause=cause,
               detail=f"stays on {devices} device(s), pinned (was {before}): a rank moved to a device of its own")

