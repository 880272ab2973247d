"""Requests on many jobs at once: cancel and preempt, of jobs given by id or selected by a filter
(:mod:`tidal.control.jobfilter`), as ``scancel`` does. At most :data:`~tidal.control.jobfilter.MAX_BULK` jobs a
request, carried out in transactions of :data:`BATCH` jobs: the database's lock is let go between them, so that
one request for a thousand jobs never holds back the others (the agents' heartbeats among them) for long.

Each job gets an outcome of its own, in the order asked: ``cancelled``, ``held`` (preempt: it was not running,
and is held now), ``preempting`` (preempt: a checkpoint was started; the job stops and is held once it is
committed), ``already_finished``, ``busy`` (another operation is in flight: ask again), ``refused`` (the state does
not allow it; ``message`` says why) or ``not_found``. Another user's job is ``not_found`` to a caller who is not
an admin, as a single job's request answers 404: its existence is not disclosed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import requests
from tidal.control.jobs import state
from tidal.control.store.db import Database
from tidal.control.store.models import JobRow
from tidal.core import TERMINAL, JobState
from tidal.errors import Conflict, named

Verb = Literal["cancel", "preempt"]
#: Jobs acted on in one transaction.
BATCH = 100


def act(db: Database, verb: Verb, ids: Sequence[str], owners: Sequence[str] | None, cause: str) -> list[dict[str, Any]]:
    """``verb`` on each job of ``ids`` (in that order, each once) that belongs to one of ``owners`` (None: any
    user's); the outcome of each."""
    ids = list(dict.fromkeys(ids))
    out: list[dict[str, Any]] = []
    for start in range(0, len(ids), BATCH):
        chunk = ids[start:start + BATCH]
        with db.tx() as s:
            rows = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(chunk)))}
            for jid in chunk:
                job = rows.get(jid)
                if job is None or (owners is not None and job.owner not in owners):
                    out.append({"id": named(jid), "outcome": "not_found", "state": None,
                                "message": f"no job {named(jid)}"})
                else:
                    out.append(_one(s, verb, job, cause))
    return out


def counts(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many jobs had each outcome."""
    return dict(Counter(r["outcome"] for r in results))


def _one(s: Session, verb: Verb, job: JobRow, cause: str) -> dict[str, Any]:
    def result(outcome: str, message: str) -> dict[str, Any]:
        return {"id": job.id, "outcome": outcome, "state": job.state, "message": message}

    if state(job) in TERMINAL:
        return result("already_finished", f"job {job.id} has already {job.state}")
    try:
        if verb == "cancel":
            requests.cancel(s, job, cause)
            return result("cancelled", f"job {job.id} cancelled")
        requests.preempt(s, job, cause)
    except Conflict as exc:  # raised before the job was changed
        return result("busy" if exc.fields.get("busy") else "refused", exc.message)
    if state(job) is JobState.CHECKPOINTING:
        return result("preempting", f"job {job.id} is being checkpointed, then held")
    return result("held", f"job {job.id} {job.state}" + ("" if state(job) is JobState.HELD else " (held)"))
