"""What the agents' answers do to a job's operation: the driver of the phase machine
(:mod:`tidal.core.operations`). An answer counts once every node of the operation's step has answered;
a step's outcome moves the operation to its next phase."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import checkpointing, failures, launch, prestaging
from tidal.control.jobs import phase
from tidal.control.store.models import ActionRow, JobRow
from tidal.core.operations import AWAITS, Phase

log = logging.getLogger(__name__)


def on_result(s: Session, a: ActionRow, data: dict[str, Any], keep: int) -> None:
    """Action ``a`` is done (its status and result are set)."""
    job = s.get(JobRow, a.job_id)
    if job is None:
        return
    ph = phase(job)
    if a.kind == "kill":
        if ph is Phase.FAILING:
            failures.merge_exits(job, data.get("ranks", ()))
            failures.settle_failure(s, job, a.id)
        return
    if a.kind in ("prestage", "unstage"):  # side orders, but a pre-copy's step
        prestaging.on_result(s, job, a, a.status == "done", data)
        if not (ph is Phase.PRECOPY and job.op == a.op):
            return
    if job.op != a.op:
        return
    if a.kind not in AWAITS[ph]:
        log.error("job %s: a %s result arrived in phase %s; ignored", job.id, a.kind, ph.value)
        return
    if ph is Phase.PARK and checkpointing.raised(s, job, a, a.id):
        return  # the next park round is out
    group = list(s.scalars(select(ActionRow).where(ActionRow.op == a.op)))
    if any(g.status in ("pending", "sent") for g in group):
        return  # the other nodes have not answered yet
    failed = [g for g in group if g.status == "failed"]
    err = "; ".join(f"{g.node}: {(g.result or {}).get('error')}" for g in failed)
    cause = a.id
    job.op = None
    if ph is Phase.STARTING:
        launch.started(s, job, a.kind, group, failed, err, cause)
    elif ph is Phase.PRECOPY:
        prestaging.precopied(s, job, cause)  # failed ones too: their restore copies the whole checkpoint
    elif ph is Phase.CUT:
        checkpointing.cut_done(s, job, group, failed, err, cause)
    elif ph is Phase.PARK:
        checkpointing.parked(s, job, group, failed, err, cause)
    elif ph in (Phase.CHECKPOINT, Phase.DUMP):
        checkpointing.dumped(s, job, group, failed, err, cause, keep)
    elif ph is Phase.FINISH:
        checkpointing.finished(s, job, cause)
