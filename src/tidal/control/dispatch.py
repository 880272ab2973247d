"""Orders to node agents: queued as actions in the database, handed out at the agents' next poll."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.history import new_id
from tidal.control.store.models import ActionRow, JobRow, NodeRow
from tidal.core import protocol


def new_action(s: Session, job: JobRow, node: str, order: protocol.Order, cause: str | None,
               *, track: bool = True, op: str | None = None) -> ActionRow:
    """Queue ``order`` for ``node``'s agent. Tracked actions are the job's operation in flight: one per
    node for an operation over several nodes (same ``op``), whose outcome is taken once all are done."""
    a = ActionRow(id=new_id("a"), job_id=job.id, node=node, kind=order.kind, payload=protocol.encode(order),
                  status="pending", cause=cause, created_at=now(s))
    a.op = op or a.id
    s.add(a)
    s.info.setdefault("new_actions", set()).add(node)  # wakes these nodes' long-polls at commit
    if track:
        job.op = a.op
    return a


def kill(s: Session, job: JobRow, node: str, cause: str | None, *, report: bool = False) -> ActionRow:
    """Stop the job's ranks on ``node`` (untracked: it is not the job's operation)."""
    return new_action(s, job, node, protocol.Kill(job_id=job.id, attempt=job.attempt, report=report), cause,
                      track=False)


def unstage(s: Session, job: JobRow, nodes: list[str], attempt: int) -> None:
    """Have the agents of ``nodes`` drop the images prestaged there for the job's attempt after ``attempt``
    (untracked; an agent whose node is down drops them when it is fenced or starts again)."""
    for node in nodes:
        row = s.get(NodeRow, node)
        if row is not None and row.up:
            new_action(s, job, node, protocol.Unstage(job_id=job.id, attempt=attempt), None, track=False)
