"""PID 1 of a rank's PID namespace. Standard library only: it is run as ``python -I -S rankinit.py``.

It is dumped and restored with the rank, so it must hold nothing tied to one node. It

* makes the namespace: the launcher process unshares CLONE_NEWPID, forks PID 1 and exits at once, so PID 1
  is re-parented to the owner (a child subreaper), exactly as a restored rank is;
* reads what to run from the spec pipe (command, environment, working directory, account) before anything
  else: it runs as root, so it is started with a fixed minimal environment and never sees the job's;
* waits for a go byte from the owner (which first places it in its cgroups and CPU set);
* runs the command as its child, which drops to the job's account first, then enters the working
  directory and takes the job's environment (only a process that no longer is root sees either);
* forwards signals, reaps orphans;
* reports the command's end on the status pipe: ``exited N`` or ``signaled N``;
* fences: when the owner's end of the status pipe closes (the owner died), it kills the whole rank.

Usage: rankinit.py CTL_OUT_FD GO_IN_FD STATUS_FD SPEC_FD. The spec is one JSON object, read to EOF:
``{"argv": [...], "env": {...}, "cwd": "/abs", "uid": N|null, "gid": N|null, "groups": [N, ...],
"pidns": bool}``. ``pidns`` false (GPU ranks): the init stays in the host's PID namespace, a child subreaper
of its rank, and its fence kills the processes below it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the init imports as little as it can
    from typing import Any

    Spec = dict[str, Any]

CLONE_NEWPID = 0x20000000
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH, signal.SIGCONT)


def _unshare_pidns() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        err = ctypes.get_errno()
        os.write(2, f"tidal-init: unshare(CLONE_NEWPID) failed: {os.strerror(err)}\n".encode())
        os._exit(125)


def _subreaper() -> None:
    """In the host's PID namespace: the rank's orphans come to the init, as they would to a PID 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(2, f"tidal-init: prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}\n".encode())
        os._exit(125)


def _kill_descendants() -> None:
    """SIGKILL every process below this one (in the host's PID namespace, where kill(-1) would reach
    every process of the machine). Children are stopped first, so none forks past the walk."""
    seen: set[int] = set()
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in seen:
                    seen.add(kid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(kid, signal.SIGSTOP)
                    todo.append(kid)
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _end_tree() -> None:
    """In the host's PID namespace, once the command has ended: what it left behind goes too, as it would
    with a namespace's PID 1, and is reaped before the end is reported (a restore may need the PIDs)."""
    _kill_descendants()
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _become(spec: Spec) -> None:
    """In the child: drop to the job's account (groups, then gid, then uid: each step needs the one after
    it not done yet), then enter the working directory with the account's own permissions."""
    uid, gid = spec.get("uid"), spec.get("gid")
    if uid is not None and gid is not None:
        os.setgroups(list(spec.get("groups") or [gid]))
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
            raise PermissionError("privileges were not dropped")
    os.chdir(spec["cwd"])


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """execvpe with the job's PATH, as the user's shell would search it. Written out because os.execvpe
    imports a module on first use, and once dropped the account may not read the interpreter's library."""
    name = argv[0]
    if "/" in name:
        os.execve(name, argv, env)
    denied = None
    for d in (env.get("PATH") or os.defpath).split(":"):
        try:
            os.execve(os.path.join(d or ".", name), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as exc:
            denied = exc
    raise denied or FileNotFoundError(2, "No such file or directory")


def _spawn(spec: Spec) -> int:
    argv = spec["argv"]
    pid = os.fork()
    if pid == 0:
        try:
            # Python ignores SIGPIPE and SIGXFSZ; the command must get the defaults, as from a shell.
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, *FORWARDED, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
        except OSError:
            os._exit(125)
        try:
            _become(spec)
        except OSError as exc:
            os.write(2, f"tidal-init: cannot enter {spec['cwd']!r} as uid {spec.get('uid')}: "
                        f"{exc.strerror or exc}\n".encode())
            os._exit(126)
        try:
            _exec(argv, spec["env"])
        except OSError as exc:
            os.write(2, f"tidal-init: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
            os._exit(127)
    return pid


def _report(status_fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(status_fd, text.encode())


def _init(spec: Spec, status_fd: int) -> None:
    os.setsid()
    os.set_inheritable(status_fd, False)  # the command must not hold the owner's lifeline
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    # Every handler before the fork: a command that exits at once must still wake the loop (its SIGCHLD
    # would otherwise arrive while SIGCHLD is ignored, and be lost). A signal to forward that comes before
    # the child exists has nobody to go to.
    child = 0

    def forward(signum: int, _frame: object) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    child = _spawn(spec)
    poller = select.poll()
    poller.register(rfd, select.POLLIN)
    poller.register(status_fd, 0)  # POLLERR/POLLHUP are always reported: the owner is gone
    while True:
        # No timeout: a lazily restored rank must not touch its memory unasked (the owner watches for a
        # command that ended unseen, and wakes or kills the init).
        for fd, ev in poller.poll():
            if fd == status_fd and ev & (select.POLLERR | select.POLLHUP):
                if os.getpid() == 1:
                    os.kill(-1, signal.SIGKILL)  # every process of the namespace but PID 1
                else:
                    _kill_descendants()
                os._exit(137)
            if fd == rfd:
                try:
                    while os.read(rfd, 512):
                        pass
                except BlockingIOError:
                    pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid, status = 0, 0
            if pid == 0:
                break
            if pid == child:
                if os.getpid() != 1:
                    _end_tree()
                if os.WIFSIGNALED(status):
                    signum = os.WTERMSIG(status)
                    _report(status_fd, f"signaled {signum}\n")
                    os._exit(128 + signum)
                code = os.waitstatus_to_exitcode(status)
                _report(status_fd, f"exited {code}\n")
                os._exit(code)


def _read_spec(fd: int) -> Spec:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    spec: Spec = json.loads(b"".join(chunks))
    return spec


def main() -> None:
    args = sys.argv[1:]
    ctl_out, go_in, status_fd, spec_fd = (int(a) for a in args[:4])
    spec = _read_spec(spec_fd)
    own_pidns = spec.get("pidns", True)
    if own_pidns:
        _unshare_pidns()
    pid = os.fork()
    if pid:
        os.write(ctl_out, f"{pid}\n".encode())
        os._exit(0)
    os.close(ctl_out)
    if not own_pidns:
        _subreaper()
    go = os.read(go_in, 1)
    os.close(go_in)
    if go != b"g":
        os._exit(125)  # the owner gave up before starting us
    _init(spec, status_fd)


if __name__ == "__main__":
    main()
