"""``GET /v1/events/stream``: the event log as server-sent events, as it grows.

Each event is one SSE message: ``id`` is its ``seq``, ``data`` the event as ``GET /v1/events`` shows it. A
client resumes where it stopped with ``Last-Event-ID`` (what EventSource sends when it reconnects) or
``?after=SEQ``; without either, the stream starts with events recorded from then on. A user sees their own
jobs' events (``job=`` one of them), an admin everyone's. A comment line every :data:`KEEPALIVE_S` of quiet
keeps proxies from closing the connection.

Bounded: the stream reads at most :data:`BATCH` events at a time and sends each batch before reading the next,
and a send waits while the client's connection is full (the server's flow control), so a client that reads
nothing holds one batch here, never the log; at most :data:`MAX_STREAMS` streams are open at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from tidal.control import jobs
from tidal.control.api import views
from tidal.control.api.auth import Principal, User
from tidal.control.api.context import Context, Ctx
from tidal.control.store.models import EventRow, JobRow
from tidal.errors import Unavailable, ValidationError, shown

router = APIRouter(prefix="/v1")

BATCH = 500
KEEPALIVE_S = 15.0
#: How often an idle stream looks whether anything was committed (no query unless something was).
POLL_S = 0.2
#: And reads the log anyway, whatever it saw (a commit that did not wake waiters).
RESCAN_S = 5.0
MAX_STREAMS = 256


def sse(event: dict[str, Any]) -> bytes:
    return f"id: {event['seq']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _start(after: int | None, last_event_id: str | None) -> int | None:
    if last_event_id is not None and last_event_id.strip():
        try:
            seq = int(last_event_id.strip())
        except ValueError:
            raise ValidationError(f"Last-Event-ID {shown(last_event_id)} is not an event's seq",
                                  field="Last-Event-ID") from None
        if seq < 0:
            raise ValidationError("Last-Event-ID must be a seq (0 or more)", field="Last-Event-ID")
        return seq
    return after


def _reader(ctx: Context, p: Principal, job: str | None) -> Callable[[int], list[dict[str, Any]]]:
    def read(after: int) -> list[dict[str, Any]]:
        with ctx.db.read() as s:
            q = select(EventRow).where(EventRow.seq > after).order_by(EventRow.seq).limit(BATCH)
            if job is not None:
                q = q.where(EventRow.job_id == job)
            elif p.owner_filter is not None:
                q = q.where(EventRow.job_id.in_(select(JobRow.id).where(JobRow.owner == p.name)))
            return [views.event(e) for e in s.scalars(q)]

    return read


@router.get("/events/stream", response_class=StreamingResponse)
def stream(request: Request, p: User, ctx: Ctx, job: str | None = None,
           after: Annotated[int | None, Query(ge=0, lt=2**63)] = None,
           last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None) -> StreamingResponse:
    """Events after ``after`` (or ``Last-Event-ID``), then each new one as it is recorded."""
    start = _start(after, last_event_id)
    with ctx.db.read() as s:
        if job is not None:
            jobs.get(s, job, owner=p.owner_filter)  # 404 for another user's job
        if start is None:
            start = int(s.scalar(select(func.max(EventRow.seq))) or 0)
    open_: Streams = request.app.state.streams
    if open_.count >= MAX_STREAMS:
        raise Unavailable(f"{MAX_STREAMS} event streams are open, the most this control plane serves",
                          hint="try again later, or read GET /v1/events?after=SEQ", retry_after=5)
    return StreamingResponse(_events(request, ctx, open_, _reader(ctx, p, job), start), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class Streams:
    """The streams open in this app."""

    def __init__(self) -> None:
        self.count = 0


async def _events(request: Request, ctx: Context, open_: Streams, read: Callable[[int], list[dict[str, Any]]],
                  after: int) -> AsyncIterator[bytes]:
    open_.count += 1
    try:
        loop = asyncio.get_running_loop()
        yield b": tidal events\n\n"  # the headers and a first line now: the client knows it is connected
        quiet_since = scanned = loop.time()
        seen = -1
        while True:
            if ctx.db.generation != seen or loop.time() - scanned >= RESCAN_S:
                seen = ctx.db.generation
                scanned = loop.time()
                try:
                    batch = await run_in_threadpool(read, after)
                except Unavailable:
                    batch = []  # the database is away: keep the stream, look again later
                for e in batch:
                    yield sse(e)  # waits while the client's connection is full
                    after = int(e["seq"])
                if batch:
                    quiet_since = loop.time()
                if len(batch) == BATCH:
                    seen = -1  # more to read now
                    continue
            if loop.time() - quiet_since >= KEEPALIVE_S:
                yield b": keep-alive\n\n"
                quiet_since = loop.time()
            await asyncio.sleep(POLL_S)
            if await request.is_disconnected():  # gone: end now, not at the next write
                return
    finally:
        open_.count -= 1
