"""Shrunk starts for guaranteed work: start on fewer devices now when that finishes earlier than waiting.

On ``d`` of its ``W`` devices a job runs ``ceil(W/d)`` ranks a device (replica splicing keeps its results
identical) at ``1/ceil(W/d)`` × ``efficiency`` of its full speed; it grows back when devices free up, so
the estimate below (no growth) is the pessimistic one. Waiting, it starts whole when enough devices free
up: the earliest time by which the running jobs' remaining times free ``W`` devices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def wait_for_devices_s(need: int, free: int, releases: Iterable[tuple[float, int]]) -> float:
    """Seconds until ``need`` devices are free, given ``free`` now and ``releases`` (seconds from now, devices
    freed) of the running jobs; infinity when they never add up."""
    if free >= need:
        return 0.0
    have = free
    for after, devices in sorted(releases):
        have += devices
        if have >= need:
            return after
    return math.inf


def shrunk_finishes_earlier(w: int, d: int, remaining_s: float, wait_s: float, *, pause_s: float,
                            efficiency: float) -> bool:
    """Whether starting on ``d`` < ``w`` devices now ends before waiting ``wait_s`` and starting whole
    (``pause_s``: the resize the shrunk job may pay to grow, charged to the shrunk side)."""
    per_device = -(-w // d)
    shrunk = remaining_s * per_device / (efficiency if per_device > 1 else 1.0) + pause_s
    return shrunk < wait_s + remaining_s
