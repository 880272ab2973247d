"""The API's two lanes of worker threads. Routes written as plain functions run on threads (the database is
reached synchronously); users' requests share one pool of :data:`USER_THREADS`, and the agents' requests
(heartbeats, results, registrations, the long-poll for actions) run on a pool of their own, so that however
many users' requests wait for a thread, an agent's never waits behind them. Its database transactions are
urgent as well (:meth:`tidal.control.store.db.Database.tx`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request

from tidal.control.intake import Intake

P = ParamSpec("P")
T = TypeVar("T")

#: Threads for users' requests at once (the rest wait for one): with PostgreSQL each may hold a connection.
USER_THREADS = 24
#: Threads for agents' requests at once. A node's agent holds one long-poll and, now and then, one more
#: request; past this many nodes' requests at once, agents' requests wait for each other, never for users'.
AGENT_THREADS = 16


@contextlib.asynccontextmanager
async def lanes(app: FastAPI) -> AsyncIterator[None]:
    """Set up both pools while the app serves (a limiter belongs to the event loop that made it), and the
    thread that commits submissions (:mod:`tidal.control.intake`)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = USER_THREADS
    app.state.agent_limiter = anyio.CapacityLimiter(AGENT_THREADS)
    ctx = app.state.ctx
    app.state.intake = intake = Intake(ctx.db, ctx.quotas, ctx.admit_sla)
    intake.start()
    try:
        yield
    finally:
        intake.stop()


async def agent_lane(request: Request, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` on a thread of the agents' pool."""
    limiter = getattr(request.app.state, "agent_limiter", None)
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=limiter)
