"""Retrying requests to a remote store: which failures are worth another try, and how long to wait.

A request that failed on the way (connection refused or dropped, a timeout, a truncated answer) or that
the server answered with a 5xx, a 408 or a 429 (S3's ``InternalError``, ``ServiceUnavailable``,
``SlowDown``, ``RequestTimeout``) is tried again after an exponentially growing, jittered pause, a bounded
number of times; then it fails with a :class:`StorageError` that says what failed, how often it was tried
and what to do. Anything else (access denied, no such bucket, a bad request) fails at once.

A request that broke on a connection the client had kept open (reset or closed by the other end before it
answered) is tried again at once and does not count as a try: after a network fault, every connection in
the pool may be dead without the client knowing (a NAT or load balancer that lost its state answers only
when one is used), and one dead connection per try would spend the tries before a fresh one is made. Such
free tries are bounded too (:attr:`RetryPolicy.stale`, the pool's size).

The classification reads exception class names and the HTTP answer that botocore attaches
(``response``), so this module imports neither botocore nor aiohttp.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from tidal.errors import StorageError, StoreUnreachable

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Exception classes (by name, anywhere in the class hierarchy) of requests that failed on the way.
_TRANSIENT_TYPES = frozenset({
    "ConnectionError",  # builtin (refused, reset, aborted) and botocore's (endpoint, proxy, connect timeout)
    "TimeoutError",  # builtin, socket.timeout, asyncio's
    "HTTPClientError",  # botocore: read timeout, connection closed
    "ResponseStreamingError",
    "IncompleteReadError",
    "ResponseParserError",
    "FSTimeoutError",
    "ClientConnectionError",  # aiohttp: server disconnected, connector errors
    "ClientPayloadError",  # aiohttp: the body ended before its Content-Length
    "ServerTimeoutError",
})

#: Failures of a connection that was open (aiohttp's ``ClientOSError`` on a kept connection, or the server
#: closing it), as opposed to one that could not be made (``ClientConnectorError``, a ``ClientOSError`` too).
_BROKEN_TYPES = frozenset({"ServerDisconnectedError", "ClientOSError", "RemoteDisconnected"})
_CONNECT_TYPES = frozenset({"ClientConnectorError"})

#: Error codes of answers that mean "try again" (S3 and S3-compatible servers).
_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling", "ThrottlingException",
    "RequestLimitExceeded", "TooManyRequests", "BadDigest", "XAmzContentSHA256Mismatch", "IncompleteBody",
})


@contextlib.contextmanager
def reading_from(url: str) -> Iterator[None]:
    """Reads from the store at ``url``: a :class:`StorageError` that says it did not answer (its tries spent on
    failures on the way, ``reason="unavailable"``) comes out as a :class:`StoreUnreachable` naming it."""
    try:
        yield
    except StoreUnreachable:
        raise
    except StorageError as e:
        if e.fields.get("reason") != "unavailable":
            raise
        raise StoreUnreachable(f"the checkpoint store {url} cannot be reached: {e.message}", store=url,
                               object=e.fields.get("object"), reason="unavailable",
                               hint="check that the store's server is up and this node reaches it") from e


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(seen) < 8:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def answer(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and error code of the server's answer behind ``exc`` (botocore's ``ClientError``,
    also when s3fs has turned it into an ``OSError``), or ``(None, None)`` where there was no answer."""
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code")
            return (int(status) if status is not None else None), (str(code) if code is not None else None)
    return None, None


def broken_connection(exc: BaseException) -> bool:
    """Whether ``exc`` says an open connection broke before the answer (not that none could be made)."""
    names = {c.__name__ for e in _chain(exc) for c in type(e).__mro__}
    return bool(names & _BROKEN_TYPES) and not names & _CONNECT_TYPES


def transient(exc: BaseException) -> bool:
    """Whether another try of the request that raised ``exc`` may succeed."""
    status, code = answer(exc)
    if status is not None or code is not None:
        return (status is not None and (status >= 500 or status in (408, 429))) or code in _TRANSIENT_CODES
    return any(c.__name__ in _TRANSIENT_TYPES for e in _chain(exc) for c in type(e).__mro__)


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``attempts`` tries; before try k+1, a pause of ``base * 2**(k-1)`` seconds (at most ``cap``),
    of which the second half is random (so that many workers that failed together do not retry together).
    Besides, up to ``stale`` tries at once, not counted, after a kept connection broke (the module says why;
    S3's pool holds 64 connections by default)."""

    attempts: int = 6
    base: float = 0.25
    cap: float = 8.0
    stale: int = 64

    def pause(self, attempt: int) -> float:
        full = min(self.cap, self.base * 2.0 ** (attempt - 1))
        return full / 2 + random.uniform(0, full / 2)

    def longest(self) -> float:
        """The most time spent pausing before the request is given up."""
        return sum(min(self.cap, self.base * 2.0 ** (k - 1)) for k in range(1, self.attempts))


def retrying(
    fn: Callable[[], T],
    policy: RetryPolicy,
    what: str,
    where: str,
    *,
    hint: str,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """``fn()``, tried again on transient failures. Other exceptions propagate unchanged, at once; when
    the tries run out, :class:`StorageError` (``reason="unavailable"``) with the last failure as its cause."""
    t0 = time.monotonic()
    attempt = 1
    stale = 0
    while True:
        try:
            return fn()
        except Exception as e:
            if not transient(e):
                raise
            if stale < policy.stale and broken_connection(e):
                stale += 1
                log.info("%s %s failed on a kept connection (%s: %s); trying again at once", what, where,
                         type(e).__name__, e)
                continue
            if attempt >= policy.attempts:
                status, code = answer(e)
                said = f"{code or status}: " if code or status else ""
                raise StorageError(
                    f"checkpoint store error {what} {where}: {said}{e} (tried {attempt} times in "
                    f"{time.monotonic() - t0:.1f} s)",
                    object=where, reason="unavailable", attempts=attempt, hint=hint,
                ) from e
            pause = policy.pause(attempt)
            log.info("%s %s failed (%s: %s); try %d of %d in %.2f s", what, where, type(e).__name__, e,
                     attempt + 1, policy.attempts, pause)
            sleep(pause)
            attempt += 1
