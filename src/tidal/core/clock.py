"""Time as the control plane reads it: behind a small interface, so that tests can set the hour.

Wall time (``time``) is what is stored and shown; monotonic time (``monotonic``) is for intervals and
deadlines inside one process."""

from __future__ import annotations

import time as _time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The machine's clocks."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()


SYSTEM: Clock = SystemClock()
