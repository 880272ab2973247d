"""Ranks that end on their own, jobs lost with their node, checkpoints found damaged, and checkpoints in a
store that cannot be reached: what each does to the job (it succeeds, fails with its root cause, or is requeued
from its last good checkpoint, or from an older one it can reach).

A job's restart budget (``max_restarts``; ``JobRow.restarts``) is spent on its own failures only: a rank killed
by a signal from outside Tidal (it crashed, or was killed for its memory: retrying it may help, a few times), and
a restore that fails with no cause found outside the job (its process may not be restorable). A rank that exits
non-zero fails the job at once: its exit status is the program's verdict. What befalls the job from outside does
not spend it: its node lost (a lease that ran out, an agent replaced or stopped), a checkpoint found damaged, a
store that cannot be reached where an older checkpoint is held elsewhere; a preemption never was a failure.
Such a job is requeued with an event that says so; a node that keeps losing its lease is drained
(:mod:`tidal.control.drains`), so that the requeues that spend nothing cannot go on for ever on one node."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control.dispatch import kill
from tidal.control.history import record
from tidal.control.jobs import (
    ACTIVE,
    checkpoints,
    drop_actions,
    end_op,
    end_run,
    good,
    nodes_of,
    parts_of,
    phase,
    restore_source,
    set_phase,
    spec_of,
    state,
    transition,
)
from tidal.control.regionstores import source_for, store_region
from tidal.control.store.models import ActionRow, CheckpointRow, CheckpointState, JobRow, NodeRow
from tidal.core import JobState
from tidal.core.operations import Phase

S = JobState


def merge_exits(job: JobRow, ranks: Iterable[dict[str, Any]]) -> None:
    exited = dict(job.exited or {})
    for r in ranks:
        exited.setdefault(str(r["rank"]), {k: r.get(k) for k in ("code", "signal", "at", "stopped")})
    job.exited = exited


def _bad(r: dict[str, Any]) -> bool:
    return not r.get("stopped") and (r.get("signal") is not None or r.get("code") != 0)


def on_exit(s: Session, job: JobRow, attempt: int, ranks: list[dict[str, Any]], cause: str) -> bool:
    """Ranks of the job exited on their own (or were killed from outside Tidal). False when stale.

    The job succeeds once every rank has exited with code 0. When a rank fails, the others would fail at
    their next collective: they are stopped, and the failure is settled once every rank's end is known,
    the earliest failing rank being the root cause and the others its consequences."""
    if job.attempt != attempt or state(job) not in ACTIVE:
        return False
    merge_exits(job, ranks)
    exited = job.exited or {}
    if phase(job) is not Phase.FAILING and any(_bad(r) for r in exited.values()):
        drop_actions(s, job.id)
        purpose = job.op_purpose
        set_phase(job, Phase.FAILING)
        job.op = None
        here = {p["node"] for p in job.placement if str(p["rank"]) in {str(r["rank"]) for r in ranks}}
        others = [n for n in nodes_of(job.placement) if n not in here]
        # (What was prestaged for a migration stays named: it is dropped once the failure is settled.)
        job.opstate = {"purpose": purpose, "prestaged": (job.opstate or {}).get("prestaged")}
        for n in others:
            kill(s, job, n, cause, report=True)
    if phase(job) is Phase.FAILING:
        settle_failure(s, job, cause)
        return True
    if len(exited) == job.ranks:
        _leave_op(s, job, cause)
        job.exit_code = 0
        transition(s, job, S.SUCCEEDED, cause, "every rank exited with code 0")
    return True


def _leave_op(s: Session, job: JobRow, cause: str) -> None:
    if state(job) is S.CHECKPOINTING:
        transition(s, job, S.RUNNING, cause, "exited during a checkpoint")
    end_op(s, job)


def settle_failure(s: Session, job: JobRow, cause: str) -> None:
    """Once every rank's end is known: the earliest failure is the cause."""
    exited = job.exited or {}
    if len(exited) < job.ranks or state(job) not in ACTIVE:
        return
    bad = sorted(((r.get("at") or 0.0, int(k), r) for k, r in exited.items() if _bad(r)), key=lambda t: t[:2])
    if not bad:  # only ranks Tidal stopped: nothing failed on its own (cannot happen; be safe)
        _leave_op(s, job, cause)
        lost(s, job, cause, "its ranks were stopped", stop_others=False, restart=False)
        return
    _, root, r = bad[0]
    rest = [f"rank {k}" for _, k, _ in bad[1:]]
    stopped = sorted(int(k) for k, x in exited.items() if x.get("stopped"))
    after = "".join([f"; then failed: {', '.join(rest)}" if rest else "",
                     f"; stopped by Tidal: ranks {stopped}" if stopped else ""])
    _leave_op(s, job, cause)
    if r.get("signal") is not None:
        lost(s, job, cause, f"rank {root} killed by signal {r['signal']} from outside Tidal{after}",
             stop_others=False)
        return
    job.exit_code = int(r.get("code") if r.get("code") is not None else 1)
    job.error = f"rank {root} exited with code {job.exit_code} (root cause){after}"
    transition(s, job, S.FAILED, cause, job.error)


def _drop_committing(s: Session, job: JobRow, why: str) -> None:
    """The job's checkpoints still being committed are given up: no report will come for them. What the job
    falls back to is its newest committed one."""
    for row in list(s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job.id,
                                                          CheckpointRow.state == CheckpointState.COMMITTING))):
        s.delete(row)
        record(s, "checkpoint_failed", job_id=job.id, detail=f"checkpoint {row.id} was not committed: {why}")


def lost(s: Session, job: JobRow, cause: str, why: str, stop_others: bool = True, restart: bool = True) -> None:
    """The job's ranks are gone (node lost, killed from outside): requeue it to be restored from its last
    committed checkpoint (or launched afresh without one). Its ranks still running on other nodes are stopped
    first (``stop_others``; not needed when every rank's end is known). ``restart``: the job's own failure,
    which counts a restart, up to ``max_restarts`` (then it fails); else (its node lost, its checkpoint
    damaged: nothing of the job's) it is requeued without counting one, and its event says so."""
    drop_actions(s, job.id)
    gone = [n for n in nodes_of(job.placement) if not ((row := s.get(NodeRow, n)) is not None and row.up)]
    if gone:  # a checkpoint its agent was committing there will never be reported
        _drop_committing(s, job, f"node {gone[0]} was lost before its commit ended")
    for node in nodes_of(job.placement) if stop_others else ():
        n = s.get(NodeRow, node)
        if n is not None and n.up:
            kill(s, job, node, cause)
    end_op(s, job)
    job.target = None
    limit = spec_of(job).max_restarts
    if restart and job.restarts >= limit:
        job.error = why
        transition(s, job, S.FAILED, cause, f"{why}; no restarts left ({limit})")
        return
    if restart:
        job.restarts += 1
    src = restore_source(s, job)
    whence = f"from checkpoint {src.id}" if src is not None else "from scratch"
    detail = (f"{why}; restart {job.restarts}/{limit}, {whence}" if restart else
              f"{why}; requeued {whence}, not counted as a restart ({job.restarts}/{limit} used)")
    # Walk the lifecycle table back to a waiting state.
    st = state(job)
    if st in (S.RUNNING, S.CHECKPOINTING):
        end_run(s, job)  # its ranks ran until now (a restore being walked back below never did)
    if st is S.CHECKPOINTING:
        transition(s, job, S.PREEMPTED, cause, detail)
        return
    if st is S.MIGRATING:
        transition(s, job, S.RESTORING, cause, why)
        st = S.RESTORING
    if st is S.RESTORING:
        transition(s, job, S.RUNNING, cause, why)
    job.placement = []
    transition(s, job, S.PENDING, cause, detail)


def fall_back(s: Session, job: JobRow, action: ActionRow, damaged: list[tuple[str, dict[str, Any]]],
              cause: str) -> bool:
    """A restore found its checkpoint damaged in the store: trying it again cannot help. Mark it bad (kept
    for inspection, never restored again) and requeue the job, without counting a restart, to resume from
    the newest good checkpoint older than it (or else the newest good one: the bad one may have been chosen
    with ``resume --from``); with none left, the job fails. False if the damage is not in the checkpoint the
    restore was given (then it is handled as any failed restore)."""
    given = action.payload.get("checkpoint") or {}
    row = s.get(CheckpointRow, given.get("id"))
    if row is None or row.state is not CheckpointState.COMMITTED \
            or not any(d.get("checkpoint") in parts_of(row) for _, d in damaged):
        return False
    row.state = CheckpointState.BAD
    what = "; ".join(f"{d.get('message')} (found on {node})" for node, d in damaged)
    ok = good(checkpoints(s, job.id))
    older = [r for r in ok if (r.created_at, r.id) < (row.created_at, row.id)]
    src = older[-1] if older else (ok[-1] if ok else None)
    if src is None:
        job.resume_from = None
        record(s, "checkpoint_bad", job_id=job.id, cause=cause,
               detail=f"checkpoint {row.id} is damaged: {what}; it is kept for inspection; no intact checkpoint "
                      "is left to resume from")
        job.error = (f"checkpoint {row.id} is damaged and job {job.id} has no other intact checkpoint to resume "
                     f"from; `tidal checkpoints {job.id}` lists what is kept; submit the job again to start over")
        transition(s, job, S.FAILED, cause, job.error)
        return True
    job.resume_from = src.id
    eid = record(s, "checkpoint_bad", job_id=job.id, cause=cause,
                 detail=f"checkpoint {row.id} is damaged: {what}; it is kept for inspection and not restored "
                        f"again; resuming from checkpoint {src.id}")
    lost(s, job, eid, f"checkpoint {row.id} is damaged", stop_others=False, restart=False)
    return True


def restore_elsewhere(s: Session, job: JobRow, action: ActionRow, away: list[tuple[str, dict[str, Any]]],
                      cause: str) -> bool:
    """A restore could not copy its checkpoint from the store of the region holding it: that store did not
    answer (``away``: node → the agent's :class:`~tidal.core.protocol.Unreachable`). The checkpoint is not
    damaged, so it is left as it is; the job is requeued, without counting a restart, to resume from the newest
    committed checkpoint older than it that a restore in the same region can have without that store (its own
    region's store holds it, or another's). With none, the restore has failed as any other (a restart, up to
    ``max_restarts``: the store may come back), saying which store could not be reached. False if the store
    reported is not the one the restore was to copy from (then it is handled as any failed restore)."""
    given = action.payload.get("checkpoint") or {}
    url = given.get("source")
    row = s.get(CheckpointRow, given.get("id"))
    if row is None or url is None or not any(u.get("store") == url for _, u in away):
        return False
    node = s.get(NodeRow, action.node)
    region = node.region if node is not None else None
    held = store_region(s, row, url)
    store = f"the checkpoint store of region {held} ({url})" if held else f"the checkpoint store {url}"
    nodes = ", ".join(n for n, u in away if u.get("store") == url)
    older = [c for c in good(checkpoints(s, job.id)) if (c.created_at, c.id) < (row.created_at, row.id)
             and (region is None or source_for(s, c, region) != url)]
    if not older:
        lost(s, job, cause, f"restore failed: checkpoint {row.id} must be copied from {store}, which cannot be "
                            f"reached from {nodes}, and no older checkpoint of job {job.id} is held elsewhere",
             stop_others=False)
        return True
    src = older[-1]
    came = source_for(s, src, region) if region is not None else None
    other = store_region(s, src, came)
    there = ("held elsewhere" if region is None else f"held in region {region}'s store" if came is None
             else f"copied from region {other}'s store" if other else f"copied from the store {came}")
    said = next(u.get("message") for _, u in away if u.get("store") == url) or "it did not answer"
    job.resume_from = src.id
    whose = f"region {held}'s store" if held else f"the store {url}"
    eid = record(s, "checkpoint_skipped", job_id=job.id, cause=cause,
                 detail=f"checkpoint {row.id} is skipped: {nodes} could not copy it from {whose}: {said}; "
                        f"resuming from checkpoint {src.id}, the newest older one, {there}")
    lost(s, job, eid, f"checkpoint {row.id} is in a store that cannot be reached", stop_others=False, restart=False)
    return True
