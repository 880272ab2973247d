"""Request bodies are bounded: an ASGI middleware reads a body before the route does and answers 413
when it is over the route's limit.

It counts the bytes as they arrive (a chunked body has no Content-Length, and a declared one may lie),
so a route never holds more than its limit. A refused body is still read, and dropped, up to
``DRAIN_BYTES``: a client that sends the whole body before it reads the answer (most do) then gets the
413 rather than a reset connection.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tidal.control.api.handlers import error_response
from tidal.errors import PayloadTooLarge

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

DRAIN_BYTES = 16 << 20


class BodyLimit:
    def __init__(self, app: App, limit: int, routes: tuple[tuple[str, str, int], ...] = ()) -> None:
        """``limit`` for every request; ``routes``: (method, path regex, limit) for routes that take more."""
        self.app = app
        self.limit = limit
        self.routes = tuple((method, re.compile(pattern), n) for method, pattern, n in routes)

    def limit_for(self, scope: Scope) -> int:
        for method, pattern, n in self.routes:
            if scope.get("method") == method and pattern.fullmatch(scope.get("path", "")):
                return n
        return self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = _content_length(scope)
        chunks: list[bytes] = []
        size = 0
        more = True
        disconnected = False
        if declared is not None and declared > limit + DRAIN_BYTES:
            more = False  # not worth reading: answer now
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            body = message.get("body", b"")
            size += len(body)
            if size <= limit:
                chunks.append(body)
            elif size > limit + DRAIN_BYTES:
                break
            more = bool(message.get("more_body", False))
        if disconnected:
            return
        if size > limit or (declared is not None and declared > limit):
            await _refuse(scope, receive, send, limit)
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    err = PayloadTooLarge(f"the request body is over {limit} bytes, the most this route takes",
                          hint="send less (see docs/cluster.md, Request limits)", limit=limit)
    await error_response(err, headers={"connection": "close"})(scope, receive, send)
