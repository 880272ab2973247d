"""The processes and threads of a rank, seen from the host."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """``pid`` and all its descendants (via ``/proc/PID/task/TID/children``)."""
    seen: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        seen.append(p)
        try:
            tids = os.listdir(PROC / str(p) / "task")
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                stack.extend(int(c) for c in (PROC / str(p) / "task" / tid / "children").read_text().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
    return seen


def threads(pids: Iterable[int]) -> list[int]:
    out: list[int] = []
    for p in pids:
        try:
            out.extend(int(t) for t in os.listdir(PROC / str(p) / "task"))
        except FileNotFoundError:
            continue
    return out


def set_affinity(pids: Iterable[int], cpus: Iterable[int]) -> None:
    """CPU affinity is per thread: set it on every thread of every process (torch keeps worker threads)."""
    mask = set(cpus)
    for tid in threads(pids):
        try:
            os.sched_setaffinity(tid, mask)
        except (ProcessLookupError, FileNotFoundError):
            continue


def alive(pid: int) -> bool:
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def fd_target(pid: int, fd: int) -> str:
    return os.readlink(PROC / str(pid) / "fd" / str(fd))


def rss_bytes(pids: Iterable[int]) -> int:
    """Resident memory of the processes: about the size of their CRIU image."""
    total = 0
    for p in pids:
        try:
            for line in (PROC / str(p) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total
