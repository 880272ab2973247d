"""Submissions committed in groups: the API's submission route hands each new job to :class:`Intake`, whose
thread commits every submission waiting at that moment in one transaction, then answers each.

Under a burst that is one take of the writers' lock and one commit for many jobs instead of one each (a
commit is a WAL flush on PostgreSQL), and the API's event loop never waits for the database: it goes on
parsing requests (an agent's heartbeat among them) while the batch commits. A lone submission is committed
at once, as before. A submission refused (bad input, over a limit, against the load) is refused alone:
:func:`accept` refuses before it writes anything, so the others of its batch are kept; a batch whose
transaction fails (the database away) fails every submission in it, none of them kept.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from tidal.control import projects, submission, userlimits, users
from tidal.control.store.db import Database
from tidal.control.store.models import JobRow
from tidal.core import JobSpec
from tidal.errors import TidalError
from tidal.policy.admission import Quotas
from tidal.policy.sla_admission import SlaMode

log = logging.getLogger(__name__)

#: The most submissions one transaction commits: a batch holds the writers' lock while it runs.
MAX_BATCH = 200


@dataclass
class _Item:
    spec: JobSpec
    owner: str
    cause: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[dict[str, Any], str]] = field(repr=False)


class Intake:
    def __init__(self, db: Database, quotas: Quotas | None = None, sla: SlaMode = "off",
                 max_batch: int = MAX_BATCH) -> None:
        self.db = db
        self.quotas = quotas
        self.sla = sla
        self.max_batch = max_batch
        self._queue: deque[_Item] = deque()
        self._ready = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.batches = 0  # transactions committed (a figure for the load benchmark)
        self.committed = 0  # submissions in them

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tidal-intake", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._ready:
            self._stop = True
            self._ready.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    async def submit(self, spec: JobSpec, owner: str, cause: str) -> tuple[dict[str, Any], str]:
        """Submit a job; its row's values and why it was admitted otherwise than asked (see
        :func:`tidal.control.submission.submit`), once its batch is committed."""
        loop = asyncio.get_running_loop()
        item = _Item(spec, owner, cause, loop, loop.create_future())
        with self._ready:
            self._queue.append(item)
            self._ready.notify()
        return await item.future

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue or self._stop)
                if not self._queue:  # stopping, nothing left to commit
                    return
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        answers: list[tuple[_Item, tuple[dict[str, Any], str] | BaseException]] = []
        try:
            with self.db.tx() as s:
                for it in batch:
                    try:
                        job, why = accept(s, it.spec, it.owner, it.cause, quotas=self.quotas, sla=self.sla)
                    except TidalError as exc:  # refused before anything of it was written
                        answers.append((it, exc))
                        continue
                    answers.append((it, (job_values(job), why)))
        except Exception as exc:  # the transaction failed: nothing of the batch was kept
            if not isinstance(exc, TidalError):
                log.exception("a batch of %d submission(s) failed", len(batch))
            answers = [(it, exc) for it in batch]
        else:
            self.batches += 1
            self.committed += sum(1 for _, a in answers if not isinstance(a, BaseException))
        for it, answer in answers:
            it.loop.call_soon_threadsafe(_settle, it.future, answer)


def accept(s: Session, spec: JobSpec, owner: str, cause: str, *, quotas: Quotas | None = None,
           sla: SlaMode = "off") -> tuple[JobRow, str]:
    """A user's submission: under a project they belong to, within their limits and the project's (else
    refused, nothing written), then admitted and stored (:func:`tidal.control.submission.submit`)."""
    u = users.get(s, owner)
    userlimits.admit(s, u, projects.for_submission(s, u, spec.project))
    return submission.submit(s, spec, owner, cause, quotas=quotas, sla=sla)


def job_values(job: Any) -> dict[str, Any]:
    """What the submission route answers with, read from the job's row while it is at hand."""
    return {"id": job.id, "state": job.state, "name": job.name, "tier": job.tier}


def _settle(future: asyncio.Future[tuple[dict[str, Any], str]],
            answer: tuple[dict[str, Any], str] | BaseException) -> None:
    if future.done():  # the client went away meanwhile
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)
