"""Work from the API committed in shared transactions: a route hands a piece of work (a function of the
session) to a :class:`Batcher`, whose thread runs every piece waiting at that moment in one transaction, then
answers each. Submissions go through one (:mod:`tidal.control.intake`), agents' heartbeats through another.

Under a burst that is one take of the writers' lock and one commit for many requests instead of one each (a
commit is a WAL flush on PostgreSQL), and the API's event loop never waits for the database: it goes on parsing
requests while a batch commits. A lone request is committed at once, as before.

A piece of work that refuses (raises a :class:`~tidal.errors.TidalError`) must do so before it writes anything:
it is answered with its error and the others of its batch are kept. A batch whose transaction fails (the
database away) fails every piece in it, none of them kept.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session

from tidal.control.store.db import Database
from tidal.errors import TidalError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The most pieces of work one transaction runs: a batch holds the writers' lock while it runs.
MAX_BATCH = 200


@dataclass
class _Item(Generic[T]):
    work: Callable[[Session], T]
    key: Any
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T] = field(repr=False)


class Batcher:
    """``name``: its thread's; ``urgent`` and ``notify``: its transactions' (:meth:`Database.tx`); ``prepare``:
    called first in each batch's transaction with the keys the pieces of work were handed with (what a batch can
    do for all of them in one statement: renew many nodes' leases)."""

    def __init__(self, db: Database, name: str, *, urgent: bool = False, notify: bool = True,
                 max_batch: int = MAX_BATCH, prepare: Callable[[Session, list[Any]], None] | None = None) -> None:
        self.db = db
        self.name = name
        self.urgent = urgent
        self.notify = notify
        self.max_batch = max_batch
        self.prepare = prepare
        self._queue: deque[_Item[Any]] = deque()
        self._ready = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.batches = 0  # transactions committed
        self.done = 0  # pieces of work in them

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Commit what is queued, then stop."""
        with self._ready:
            self._stop = True
            self._ready.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    async def run(self, work: Callable[[Session], T], key: Any = None) -> T:
        """``work(session)``'s result (or its error), once its batch is committed; ``key``: for ``prepare``."""
        loop = asyncio.get_running_loop()
        item: _Item[T] = _Item(work, key, loop, loop.create_future())
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

    def _commit(self, batch: list[_Item[Any]]) -> None:
        answers: list[tuple[_Item[Any], Any]] = []
        try:
            with self.db.tx(urgent=self.urgent, notify=self.notify) as s:
                if self.prepare is not None:
                    self.prepare(s, [it.key for it in batch])
                for it in batch:
                    try:
                        answers.append((it, it.work(s)))
                    except TidalError as exc:  # refused before anything of it was written
                        answers.append((it, exc))
        except Exception as exc:  # the transaction failed: nothing of the batch was kept
            if not isinstance(exc, TidalError):
                log.exception("a batch of %d request(s) failed", len(batch))
            answers = [(it, exc) for it in batch]
        else:
            self.batches += 1
            self.done += sum(1 for _, a in answers if not isinstance(a, BaseException))
        for it, answer in answers:
            it.loop.call_soon_threadsafe(_settle, it.future, answer)


def _settle(future: asyncio.Future[Any], answer: Any) -> None:
    if future.done():  # the client went away meanwhile
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)
