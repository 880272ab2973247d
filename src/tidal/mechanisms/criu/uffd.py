"""Holding a lazily restored rank's userfaultfds while ``criu lazy-pages`` fills its memory in.

The daemon holds one userfaultfd per restored address space. Should it die, the kernel releases them and
the rank's pending and later faults on pages still missing are served as zero pages: the rank would go on
(or crash) with memory it never had. Tidal takes its own copy of each (pidfd_getfd), so that a dead daemon
leaves the faults pending instead, until Tidal has killed the rank; it lets them go once the daemon is done.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

from tidal.mechanisms.criu import tasks

SYS_PIDFD_OPEN = 434
SYS_PIDFD_GETFD = 438
_libc = ctypes.CDLL(None, use_errno=True)


def hold(pid: int) -> list[int]:
    """Copies of the userfaultfds that process ``pid`` holds (empty where the kernel cannot give them)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    wanted = [int(n) for n in names if _is_uffd(pid, int(n))]
    if not wanted:
        return []
    pidfd = _libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return []
    got = []
    try:
        for fd in wanted:
            mine = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
            if mine >= 0:
                os.set_inheritable(mine, False)
                got.append(mine)
    finally:
        os.close(pidfd)
    return got


def _is_uffd(pid: int, fd: int) -> bool:
    try:
        return tasks.fd_target(pid, fd) == "anon_inode:[userfaultfd]"
    except OSError:
        return False


def release(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
