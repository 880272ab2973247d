"""FakeClock: a Clock that moves only when told."""

from __future__ import annotations

import pytest

from tidal.core.clock import Clock
from tidal.errors import ValidationError
from tidal.testing import FakeClock


def test_starts_where_it_is_told_and_stands_still() -> None:
    clock: Clock = FakeClock(time=1000.0, monotonic=5.0)
    assert (clock.time(), clock.monotonic()) == (1000.0, 5.0)
    assert (clock.time(), clock.monotonic()) == (1000.0, 5.0)


def test_advance_moves_both_clocks() -> None:
    clock = FakeClock(time=1000.0)
    clock.advance(2.5)
    clock.advance(0)
    assert (clock.time(), clock.monotonic()) == (1002.5, 2.5)
    with pytest.raises(ValidationError, match="forward"):
        clock.advance(-1)
    assert (clock.time(), clock.monotonic()) == (1002.5, 2.5)


def test_set_moves_wall_time_alone() -> None:
    clock = FakeClock(time=1000.0, monotonic=7.0)
    clock.set(10.0)  # back, as a clock adjustment may
    assert (clock.time(), clock.monotonic()) == (10.0, 7.0)
    clock.set(2e9)
    assert (clock.time(), clock.monotonic()) == (2e9, 7.0)
    assert repr(clock) == "FakeClock(time=2000000000.0, monotonic=7.0)"


def test_the_default_is_a_plausible_hour() -> None:
    clock = FakeClock()
    assert clock.time() > 1.6e9 and clock.monotonic() == 0.0
