"""Pre-staging a migration's target: while the job is checkpointed where it runs, each node its ranks move to
fetches the checkpoint the job descends from, so that the restore there fetches only what changed since.

A prestage is a side order, outside the job's operation (:mod:`tidal.core.operations`): nothing waits for it,
and its outcome, an event, never moves the operation on. A failed prestage, or one an agent of an older
release refuses, costs nothing but the restore's full fetch. The nodes it went to are kept in the
operation's state; when the operation ends, those the restore does not go to are told to drop what they
fetched (:func:`tidal.control.jobs.end_op`), and the agents drop it anyway after a while (see
:mod:`tidal.agent.prestaging`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from tidal.control import linkrates
from tidal.control.dispatch import new_action
from tidal.control.history import new_id, record
from tidal.control.jobs import parts_of, restore_source, set_phase
from tidal.control.regionstores import replicated, source_for, store_region
from tidal.control.store.models import ActionRow, CheckpointRow, JobRow, NodeRow
from tidal.core import protocol
from tidal.core.operations import Phase
from tidal.core.units import size

MIB = 1 << 20


def moving(job: JobRow) -> dict[str, list[int]]:
    """Node → the ranks ``job.target`` moves onto it from another node (a rank that stays where it runs
    needs nothing fetched ahead)."""
    here = {int(p["rank"]): p["node"] for p in job.placement}
    out: dict[str, list[int]] = {}
    for rank, (node, _) in enumerate(job.target or ()):
        if here.get(rank) != node:
            out.setdefault(node, []).append(rank)
    return out


def order(s: Session, job: JobRow, cause: str | None, *, op: str | None = None) -> list[str]:
    """A migration or resize of ``job`` (to ``job.target``) starts: have each node that ranks move onto
    prestage them from the checkpoint the running attempt descends from (the one it was restored from, or
    its newest since). Nothing without a committed checkpoint. ``op``: the prestages are the operation's
    step (a pre-copy, see :func:`precopy`), else side orders. Returns the nodes they went to."""
    source = restore_source(s, job)
    if source is None:
        return []
    nodes = []
    for node, ranks in moving(job).items():
        row = s.get(NodeRow, node)
        if row is None or not row.up:
            continue
        # In another region, the node first copies the checkpoint into its region's store: the restore
        # then copies only what the migration's own checkpoint changed.
        ref = protocol.CheckpointRef(id=source.id, parts=parts_of(source), source=source_for(s, source, row.region))
        new_action(s, job, node, protocol.Prestage(job_id=job.id, attempt=job.attempt, checkpoint=ref, ranks=ranks),
                   cause, track=op is not None, op=op)
        nodes.append(node)
    if nodes:
        job.opstate = {**(job.opstate or {}), "prestaged": {"attempt": job.attempt, "nodes": nodes}}
    return nodes


def needs_precopy(s: Session, job: JobRow) -> bool:
    """Whether a node ``job.target`` moves ranks onto is in a region whose store lacks the checkpoint the job
    descends from: then it is copied there first, while the job runs on (:func:`precopy`)."""
    source = restore_source(s, job)
    if source is None:
        return False
    rows = [s.get(NodeRow, n) for n in moving(job)]
    return any(r is not None and r.up and source_for(s, source, r.region) is not None for r in rows)


def precopy(s: Session, job: JobRow, purpose: str, cause: str | None) -> None:
    """The first step of a move into another region's store (:data:`~tidal.core.operations.Phase.PRECOPY`):
    the targets copy the job's last checkpoint while it runs on; the move's checkpoint starts once they
    have answered (:func:`precopied`), so that the job is stopped only for what changed since."""
    op = new_id("o")
    set_phase(job, Phase.PRECOPY)
    job.op_purpose = purpose
    nodes = order(s, job, cause, op=op)
    job.op = op
    record(s, "precopying", job_id=job.id, cause=cause,
           detail=f"copying checkpoint {job_checkpoint(s, job)} into the store of {', '.join(nodes)} while the "
                  f"job runs, before its {purpose} checkpoint")


def precopied(s: Session, job: JobRow, cause: str | None) -> None:
    """The pre-copy is over (every target answered, failed, or went away): the move's checkpoint now, keeping
    what the targets prestaged for its restore."""
    from tidal.control.checkpointing import checkpoint  # the checkpoint's module orders prestages: one way

    purpose = job.op_purpose or "migrate"
    staged = (job.opstate or {}).get("prestaged")
    set_phase(job, Phase.IDLE)
    job.op = None
    job.op_purpose = None
    job.opstate = None
    checkpoint(s, job, purpose, cause, prestaged=staged)


def keep(job: JobRow, nodes: list[str]) -> None:
    """The restore goes to ``nodes``: what was prestaged there is theirs to use, not dropped with the
    operation's end."""
    staged = (job.opstate or {}).get("prestaged")
    if staged:
        left = [n for n in staged["nodes"] if n not in nodes]
        job.opstate = {**(job.opstate or {}), "prestaged": {**staged, "nodes": left}}


def on_result(s: Session, job: JobRow, a: ActionRow, ok: bool, data: dict[str, Any]) -> None:
    """A prestage's or unstage's answer: an event for a prestage, nothing more."""
    if a.kind != "prestage":
        return
    if ok:
        copied = data.get("replicated_bytes")
        ck = s.get(CheckpointRow, str(data.get("checkpoint"))) if copied is not None else None
        row = s.get(NodeRow, a.node)
        if ck is not None and row is not None:
            record(s, "replicated", job_id=job.id, node=a.node, cause=a.id,
                   detail=f"checkpoint {ck.id} copied from region {', '.join(ck.regions or ())} to {row.region}: "
                          f"{int(data.get('replicated_chunks') or 0)} chunk(s), {size(int(copied or 0))} crossed "
                          "ahead of the move")
            came_from = store_region(s, ck, (a.payload.get("checkpoint") or {}).get("source"))
            took = data.get("replicated_s")
            if came_from is not None and took is not None:  # the copy, timed: the link's rate (linkrates)
                linkrates.note(s, came_from, row.region, int(copied or 0), float(took))
            replicated(s, ck, [row.region])
        record(s, "prestaged", job_id=job.id, node=a.node, cause=a.id,
               detail=f"checkpoint {data.get('checkpoint')}, ranks {data.get('ranks')}: "
                      f"{int(data.get('bytes', 0)) / MIB:.1f} MiB in {float(data.get('seconds', 0)):.1f}s")
    else:
        error = (a.result or {}).get("error")
        record(s, "prestage_failed", job_id=job.id, node=a.node, cause=a.id,
               detail=f"{error}; a restore there fetches the whole checkpoint")


def job_checkpoint(s: Session, job: JobRow) -> str:
    source = restore_source(s, job)
    return source.id if source is not None else "-"
