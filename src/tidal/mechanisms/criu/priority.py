"""Work that is off a job's pause yields the CPU to work that is on it.

The commit of a checkpoint the job already runs on from (a periodic checkpoint; a resize restored from the
node's images) and the hashing that prepares it compete for the cores with what the job waits for: the dumps
of its ranks on the other nodes of a machine, its restore, its own ranks. On Linux a thread is a task of its
own with its own nice value, inherited by the threads it starts, so such work runs in threads at a lower
priority and takes only the CPU that the rest leaves."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: How much nicer than the agent such work runs: a nice-10 task weighs about a tenth of a nice-0 one.
BACKGROUND_NICE = 10


def yield_cpu() -> None:
    """Lower the calling thread's priority by :data:`BACKGROUND_NICE` (best effort: never an error)."""
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))


def in_background(work: Callable[[], T]) -> T:
    """``work``'s result, computed in a thread of lowered priority (its failure raised here as it was raised)."""
    with ThreadPoolExecutor(1, initializer=yield_cpu, thread_name_prefix="tidal-background") as pool:
        return pool.submit(work).result()
