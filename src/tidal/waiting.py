"""Waiting for something to happen: poll a condition until it holds, or fail saying what was waited for.

Tests synchronise with processes, threads and servers through these, never through a bare ``sleep``; the
launcher of a local cluster, the demos and the benchmarks wait with the same function."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tidal.errors import TidalError, ValidationError

T = TypeVar("T")

#: Seconds between two tries of a condition, unless the caller says otherwise.
INTERVAL = 0.05

_REPR_LIMIT = 400


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


class WaitTimeout(TidalError):
    """A condition did not hold within its timeout (:meth:`after` says so from what was seen).

    ``what`` names what was waited for; ``last_value`` is what the condition last returned (``None`` if it
    never returned), ``last_error`` the exception it last raised (``None`` if it never raised)."""

    what: str = ""
    timeout: float = 0.0
    elapsed: float = 0.0
    tries: int = 0
    last_value: object = None
    last_error: Exception | None = None

    @classmethod
    def after(cls, what: str, *, timeout: float, elapsed: float, tries: int, last_value: object,
              last_error: Exception | None, last_try_raised: bool, hint: str | None = None) -> WaitTimeout:
        if last_try_raised:
            last = f"the last try raised {_short(last_error)}"
        else:
            last = f"the last try returned {_short(last_value)}"
            if last_error is not None:
                last += f" (an earlier one raised {_short(last_error)})"
        exc = cls(f"timed out after {elapsed:.1f}s (timeout {timeout:g}s, {tries} tries) waiting for {what}; "
                  f"{last}", hint=hint, what=what, timeout=timeout, elapsed=elapsed, tries=tries)
        exc.what, exc.timeout, exc.elapsed, exc.tries = what, timeout, elapsed, tries
        exc.last_value, exc.last_error = last_value, last_error
        return exc


def wait_until(condition: Callable[[], T | None], *, timeout: float, what: str, interval: float = INTERVAL,
               hint: str | None = None) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns a truthy value, and return that value.

    An exception from ``condition`` counts as "not yet": it is kept as the last error and the polling goes
    on. After ``timeout`` seconds (``condition`` is always tried at least once, and once more at the
    deadline) :class:`WaitTimeout` is raised: its message says ``what`` was waited for, for how long, and
    what the last try returned or raised (that exception is also its ``__cause__``), and ``hint`` what to do
    about it."""
    if timeout < 0:
        raise ValidationError(f"timeout must be at least 0, got {timeout}", field="timeout")
    if interval <= 0:
        raise ValidationError(f"interval must be more than 0, got {interval}", field="interval")
    start = time.monotonic()
    deadline = start + timeout
    tries = 0
    last_value: object = None
    last_error: Exception | None = None
    last_try_raised = False
    while True:
        tries += 1
        try:
            value = condition()
        except Exception as e:
            last_error, last_try_raised = e, True
        else:
            if value:
                return value
            last_value, last_try_raised = value, False
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout.after(what, timeout=timeout, elapsed=now - start, tries=tries, last_value=last_value,
                              last_error=last_error, last_try_raised=last_try_raised, hint=hint) from (
                last_error if last_try_raised else None)
        time.sleep(min(interval, deadline - now))


def wait_for_line(path: Path, pattern: str, *, timeout: float = 60.0, interval: float = 0.01) -> re.Match[str]:
    """Wait until the text of ``path`` (which may not exist yet) has a line matching the regular expression
    ``pattern`` (``^`` and ``$`` match at each line); return the first match."""
    rx = re.compile(pattern, re.M)

    def seen() -> re.Match[str] | None:
        try:
            return rx.search(path.read_text(errors="replace"))
        except FileNotFoundError:
            return None

    return wait_until(seen, timeout=timeout, what=f"{pattern!r} in {path}", interval=interval)
