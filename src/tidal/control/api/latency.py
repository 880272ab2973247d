"""The API's request latency, by route: an ASGI middleware that times each request until its response starts
(for a route that streams, until its first bytes; a long-poll's wait is part of it) and files it under the
route's template (``/v1/jobs/{job_id}``), never the raw path, so that a histogram's series stay few."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNMATCHED = "<unmatched>"


def histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("tidal_http_request_duration_seconds",
                     "Time from a request's arrival to the start of its response, by method, route template and "
                     "status (this process's: it starts again with the process).",
                     ("method", "route", "status"), registry=registry, buckets=BUCKETS)


def route_of(scope: Scope) -> str:
    """The template of the route that served the request (set in the scope by the router)."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class Latency:
    def __init__(self, app: ASGIApp, latency: Histogram) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        seen = [False]

        def observe(status: int) -> None:
            seen[0] = True
            self.latency.labels(scope.get("method", ""), route_of(scope), str(status)).observe(
                time.perf_counter() - t0)

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start" and not seen[0]:
                observe(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            if not seen[0]:
                observe(500)
