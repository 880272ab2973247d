"""Each user's request rate: a token bucket per user, in this process's memory, checked by an ASGI middleware
before anything else is done of the request (no database work, no body read): a request beyond the user's rate
is answered 429 with ``Retry-After`` (whole seconds, at least 1).

The caller is found by its token's sha256 in the principal cache (:class:`tidal.control.api.auth.Principals`),
which holds the user's rate and burst. A token not in it (its first request, one unknown or expired) passes:
the route's authentication looks it up (and refuses it, or caches it for the next request). Agents' routes
(``/v1/agent/*``), agents' own tokens, ``GET /metrics``, ``/healthz`` and the dashboard's files are never limited.

The table holds one bucket per user who made a request lately: a bucket that has filled up again is the same
as none, and is dropped (at most every :data:`SWEEP_S`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from tidal.control import tokens
from tidal.control.api.auth import COOKIE, Principals
from tidal.control.api.handlers import error_response
from tidal.core.clock import Clock
from tidal.errors import TooManyRequests

SWEEP_S = 60.0
_COOKIE = COOKIE.encode() + b"="


@dataclass
class Bucket:
    level: float  # requests that may be made now
    at: float  # when ``level`` was (monotonic)
    rate: float
    burst: int

    def refill(self, t: float) -> None:
        self.level = min(float(self.burst), self.level + max(0.0, t - self.at) * self.rate)
        self.at = t


class Buckets:
    """Users' token buckets, and how many requests of each were refused (since this process started)."""

    def __init__(self) -> None:
        self.buckets: dict[str, Bucket] = {}
        self.refused: dict[str, int] = {}
        self.swept_at = 0.0

    def take(self, user: str, rate: float, burst: int, t: float) -> float:
        """Take one request from ``user``'s bucket at monotonic time ``t``: 0 if it may go ahead, else the
        seconds until it would (and it is counted refused)."""
        if t - self.swept_at >= SWEEP_S:
            self.sweep(t)
        b = self.buckets.get(user)
        if b is None:
            b = self.buckets[user] = Bucket(float(burst), t, rate, burst)
        b.rate, b.burst = rate, burst  # an admin may have changed them
        b.refill(t)
        if b.level >= 1.0:
            b.level -= 1.0
            return 0.0
        self.refused[user] = self.refused.get(user, 0) + 1
        return (1.0 - b.level) / rate

    def sweep(self, t: float) -> None:
        self.swept_at = t
        for user, b in list(self.buckets.items()):
            b.refill(t)
            if b.level >= b.burst:
                del self.buckets[user]

    def forget(self, user: str) -> None:
        """A removed user's bucket and count."""
        self.buckets.pop(user, None)
        self.refused.pop(user, None)


def exempt(path: str) -> bool:
    return (path.startswith(("/v1/agent/", "/ui/")) or path in ("/metrics", "/healthz", "/ui"))


def token_of(scope: Scope) -> str | None:
    """The request's bearer token, else the dashboard's cookie (as :func:`tidal.control.api.auth.principal`
    takes them)."""
    cookie = None
    value: bytes
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return value[7:].strip().decode("latin-1") if value.startswith(b"Bearer ") else None
        if name == b"cookie":
            cookie = value
    if cookie is None:
        return None
    for part in cookie.split(b";"):
        if part.strip().startswith(_COOKIE):
            return part.strip()[len(_COOKIE):].decode("latin-1")
    return None


class RateLimit:
    def __init__(self, app: ASGIApp, principals: Principals, buckets: Buckets, clock: Callable[[], Clock]) -> None:
        self.app = app
        self.principals = principals
        self.buckets = buckets
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not exempt(scope.get("path", "")):
            token = token_of(scope)
            entry = self.principals.known.get(tokens.digest(token)) if token else None
            clock = self.clock()
            if (entry is not None and entry.rate is not None and entry.principal.role != "agent"
                    and entry.works(clock.time())):
                name = entry.principal.name
                wait = self.buckets.take(name, entry.rate, entry.burst, clock.monotonic())
                if wait > 0:
                    after = max(1, math.ceil(wait))
                    err = TooManyRequests(
                        f"user {name} is over their request rate of {entry.rate:g} requests/s (bursts of "
                        f"{entry.burst}): try again in {after}s", rate=entry.rate, burst=entry.burst,
                        retry_after=after,
                        hint=f"send fewer requests; an admin may raise the limit (`tidal user set {name} --rate R "
                             "--burst B`)")
                    await error_response(err, headers={"Retry-After": str(after)})(scope, receive, send)
                    return
        await self.app(scope, receive, send)
