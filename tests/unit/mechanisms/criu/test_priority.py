"""Work off a job's pause runs at a lower CPU priority, in a thread of its own; the caller's is untouched."""

from __future__ import annotations

import os
import threading

import pytest

from tidal.errors import CheckpointError
from tidal.mechanisms.criu.priority import BACKGROUND_NICE, in_background


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_background_work_runs_nicer_and_gives_back_its_result() -> None:
    mine = _nice()
    seen = in_background(lambda: (_nice(), threading.get_native_id()))
    assert seen[0] == min(19, mine + BACKGROUND_NICE)
    assert seen[1] != threading.get_native_id()
    assert _nice() == mine


def test_background_work_that_fails_raises_its_error_here() -> None:
    def fail() -> None:
        raise CheckpointError("the store refused the commit", hint="look at the store")

    with pytest.raises(CheckpointError, match="the store refused the commit"):
        in_background(fail)
