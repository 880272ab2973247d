"""How the API runs its requests' database work without letting users' load delay the agents.

- Routes written as plain functions run on threads. Users' requests share one pool of :data:`USER_THREADS`;
  the agents' requests run on a pool of their own (:func:`agent_lane`), so that however many users' requests
  wait for a thread, an agent's never waits behind them. Agents' transactions are urgent as well
  (:meth:`tidal.control.store.db.Database.tx`).
- Submissions and heartbeats are committed in shared transactions (:class:`tidal.control.batches.Batcher`,
  :func:`in_batch`): a burst costs one commit per batch, and the event loop never waits for the database.
- An agent's long-poll for actions waits on the event loop (:class:`ActionSignal`), holding no thread: a
  cluster of hundreds of nodes holds hundreds of long-polls at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from tidal.control import agents
from tidal.control.batches import Batcher
from tidal.control.intake import ADMISSIONS
from tidal.control.store.db import Database
from tidal.control.submission import SEQ_COUNTER

P = ParamSpec("P")
T = TypeVar("T")

#: Threads for users' requests at once (the rest wait for one): with PostgreSQL each may hold a connection.
USER_THREADS = 24
#: Threads for agents' requests at once (their long-polls hold none while they wait).
AGENT_THREADS = 16
#: The batchers the app keeps: submissions, and heartbeats (urgent; nobody waits on a lease's renewal).
INTAKE, HEARTBEATS = "intake", "heartbeats"


class ActionSignal:
    """Wakes the long-polls of a node waiting on the event loop when a commit creates actions for it (the
    database calls :meth:`wake` from the committing thread with the nodes it made actions for). Each node
    has a count of its wake-ups: a long-poll reads it before it looks for actions, and waits only while it has
    not moved, so actions made while it looked are not slept through."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.woken: dict[str, int] = {}  # node → wake-ups (one entry per node the cluster has had)
        self._events: dict[str, asyncio.Event] = {}  # node → the event its long-polls wait on now

    def wake(self, nodes: frozenset[str]) -> None:
        self.loop.call_soon_threadsafe(self._fire, nodes)

    def _fire(self, nodes: frozenset[str]) -> None:
        for node in nodes:
            self.woken[node] = self.woken.get(node, 0) + 1
            event = self._events.pop(node, None)
            if event is not None:
                event.set()

    async def changed(self, node: str, seen: int, timeout: float) -> None:
        """Return once ``node`` has been woken since its count was ``seen``, or after ``timeout`` seconds."""
        if self.woken.get(node, 0) != seen:
            return
        event = self._events.get(node)
        if event is None:
            event = self._events[node] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


@contextlib.asynccontextmanager
async def lanes(app: FastAPI) -> AsyncIterator[None]:
    """Set up the pools, the batchers and the long-polls' signal while the app serves (a limiter and an event
    belong to the event loop that made them)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = USER_THREADS
    app.state.agent_limiter = anyio.CapacityLimiter(AGENT_THREADS)
    db: Database = app.state.ctx.db
    db.info.setdefault(ADMISSIONS, {})  # who may submit under which project, looked up once a second
    db.info.setdefault(SEQ_COUNTER, {})  # the next submission number, read from the database once
    renew = functools.partial(agents.renew_leases, lease_s=app.state.ctx.lease_s)
    batchers = {INTAKE: Batcher(db, "tidal-intake"),
                HEARTBEATS: Batcher(db, "tidal-heartbeats", urgent=True, notify=False, prepare=renew)}
    app.state.batchers = batchers
    signal = app.state.action_signal = ActionSignal(asyncio.get_running_loop())
    db.on_actions.append(signal.wake)
    for b in batchers.values():
        b.start()
    try:
        yield
    finally:
        db.on_actions.remove(signal.wake)
        for b in batchers.values():
            b.stop()


async def agent_lane(request: Request, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` on a thread of the agents' pool."""
    limiter = getattr(request.app.state, "agent_limiter", None)
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=limiter)


async def in_batch(request: Request, name: str, work: Callable[[Session], T], *, db: Database,
                   urgent: bool = False, notify: bool = True, key: Any = None) -> T:
    """``work(session)`` committed in the app's batcher ``name`` (``key``: for the batcher's ``prepare``); where
    the app is served without its lifespan (a test client), in a transaction of its own (``urgent``, ``notify``:
    that transaction's)."""
    batchers: dict[str, Batcher] | None = getattr(request.app.state, "batchers", None)
    if batchers is not None:
        return await batchers[name].run(work, key)

    def alone() -> T:
        with db.tx(urgent=urgent, notify=notify) as s:
            return work(s)

    return await (agent_lane(request, alone) if urgent else run_in_threadpool(alone))
