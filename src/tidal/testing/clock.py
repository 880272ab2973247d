"""A clock that tests move by hand."""

from __future__ import annotations

import threading

from tidal.errors import ValidationError


class FakeClock:
    """A :class:`tidal.core.clock.Clock` whose time moves only when a test says so.

    ``advance(seconds)`` moves wall time and monotonic time together, as time passing does; ``set(wall)``
    sets wall time alone, as a clock adjustment does (monotonic time never goes back)."""

    def __init__(self, time: float = 1_700_000_000.0, monotonic: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._time = float(time)
        self._monotonic = float(monotonic)

    def time(self) -> float:
        with self._lock:
            return self._time

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValidationError(f"time only goes forward: cannot advance by {seconds}s", field="seconds")
        with self._lock:
            self._time += seconds
            self._monotonic += seconds

    def set(self, time: float) -> None:
        with self._lock:
            self._time = float(time)

    def __repr__(self) -> str:
        return f"FakeClock(time={self._time!r}, monotonic={self._monotonic!r})"
