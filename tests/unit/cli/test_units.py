"""Numbers as people read them in the CLI's tables and messages."""

from __future__ import annotations

from datetime import datetime

from tidal.cli import units


def test_durations() -> None:
    assert units.duration(1.083412) == "1.08 s"
    assert units.duration(0.35) == "350 ms"
    assert units.duration(12.34) == "12.3 s"
    assert units.duration(192) == "3m 12s"
    assert units.duration(7500) == "2h 05m"
    assert units.duration(3 * 86400 + 4 * 3600 + 59) == "3d 4h"
    assert units.duration(None) == "-"


def test_sizes() -> None:
    assert units.size(512) == "512 B"
    assert units.size(1536) == "1.5 KiB"
    assert units.size(4294967296) == "4.0 GiB"
    assert units.size(3 * 2**50) == "3.0 PiB"
    assert units.size(5 * 2**60) == "5120.0 PiB"
    assert units.size(None) == "-"


def test_moments() -> None:
    now = 1_700_000_000.0
    assert units.ago(now - 5.7, now) == "5s ago"
    assert units.ago(now - 192, now) == "3m 12s ago"
    assert units.ago(now - 7500, now) == "2h 05m ago"
    assert units.ago(now + 3, now) == "0s ago"  # another machine's clock, a little ahead
    assert units.ago(now + 86399, now) == "in 23h 59m"  # an expiry
    assert units.ago(None, now) == "-"
    today = datetime.now().replace(hour=14, minute=2, second=11).timestamp()
    assert units.clock(today) == "14:02:11"
    assert units.clock(datetime(2024, 5, 1, 14, 2, 11).timestamp()) == "2024-05-01 14:02:11"
    assert units.rate(2.449) == "2.45/s" and units.rate(310.2) == "310/s"
