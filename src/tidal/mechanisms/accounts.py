"""The Unix account a job runs as, and touching the job's files as that account from a process that runs
as root.

The agent captures and puts back a job's working directory. Done as root, a job could steer that
(a symlink swapped in at the right moment makes root read or write a file of its choosing), and what root
creates would belong to root, so that the job, restored as its account, could no longer write its own
files. Linux's file-system identity (setfsuid/setfsgid) is per thread, unlike setuid in glibc, which
changes every thread: a thread of the agent takes the account's identity for file access only, with the
kernel's own permission checks (the file capabilities of root are dropped while it differs from 0), and
takes root's back after.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import pwd
from collections.abc import Iterator
from dataclasses import dataclass

from tidal.errors import MechanismError

_libc = ctypes.CDLL(None, use_errno=True)
# The raw system call changes this thread only (glibc's setgroups changes every thread of the process).
# Elsewhere the number is unknown here: None, and acting for another account is refused (not guessed).
SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())


@dataclass(frozen=True)
class Account:
    """A job's account: its command runs as it (the rank's init stays root: CRIU needs it), and Tidal
    touches the job's working directory as it."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def named(cls, user: str) -> Account:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise MechanismError(f"no Unix account {user!r} on this node",
                                 hint="create the account on every node, or map the user to another one") from None
        return cls(pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))


def _set(uid: int, gid: int, groups: tuple[int, ...]) -> None:
    if SYS_SETGROUPS is None:
        raise MechanismError(f"cannot act for another account on {platform.machine()}: no per-thread setgroups "
                             "known for it", hint="run jobs as the agent's own account on this machine")
    arr = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if _libc.syscall(SYS_SETGROUPS, len(groups), arr) != 0:
        err = ctypes.get_errno()
        raise MechanismError(f"cannot take the groups of account {uid}: {os.strerror(err)}",
                             hint="the agent must run as root to act for other accounts")
    # setfsuid and setfsgid return the previous value and cannot fail visibly: read it back to know.
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    if _libc.setfsuid(-1) != uid or _libc.setfsgid(-1) != gid:
        raise MechanismError(f"cannot take file-system identity {uid}:{gid}",
                             hint="the agent must run as root to act for other accounts")


@contextlib.contextmanager
def acting_as(who: Account | None) -> Iterator[None]:
    """File access of this thread as ``who`` (None, or the process's own account: unchanged)."""
    if who is None or (who.uid == os.geteuid() and who.gid == os.getegid()):
        yield
        return
    own = (os.geteuid(), os.getegid(), tuple(os.getgroups()))
    _set(who.uid, who.gid, who.groups or (who.gid,))
    try:
        yield
    finally:
        _set(*own)
