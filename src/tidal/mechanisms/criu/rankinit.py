"""PID 1 of a rank's PID namespace. Standard library only: it is run as ``python -I -S rankinit.py``.

It is dumped and restored with the rank, so it must hold nothing tied to one node. It

* makes the namespace: the launcher process unshares CLONE_NEWPID, forks PID 1 and exits at once, so PID 1
  is re-parented to the owner (a child subreaper), exactly as a restored rank is;
* waits for a go byte from the owner (which first places it in its cgroups and CPU set);
* runs the command as its child, forwards signals, reaps orphans;
* reports the command's end on the status pipe: ``exited N`` or ``signaled N``;
* fences: when the owner's end of the status pipe closes (the owner died), it kills the whole rank.

Usage: rankinit.py CTL_OUT_FD GO_IN_FD status_fd -- ARGV...
"""

import contextlib
import ctypes
import os
import select
import signal
import sys

CLONE_NEWPID = 0x20000000
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH, signal.SIGCONT)


def _unshare_pidns() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        err = ctypes.get_errno()
        os.write(2, f"tidal-init: unshare(CLONE_NEWPID) failed: {os.strerror(err)}\n".encode())
        os._exit(125)


def _spawn(argv: list[str]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            # Python ignores SIGPIPE and SIGXFSZ; the command must get the defaults, as from a shell.
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, *FORWARDED, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"tidal-init: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
            os._exit(127)
    return pid


def _report(status_fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(status_fd, text.encode())


def _init(argv: list[str], status_fd: int) -> None:
    os.setsid()
    os.set_inheritable(status_fd, False)  # the command must not hold the owner's lifeline
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    child = _spawn(argv)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(rfd, select.POLLIN)
    poller.register(status_fd, 0)  # POLLERR/POLLHUP are always reported: the owner is gone
    while True:
        for fd, ev in poller.poll():
            if fd == status_fd and ev & (select.POLLERR | select.POLLHUP):
                os.kill(-1, signal.SIGKILL)  # every process of the namespace but PID 1
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
                if os.WIFSIGNALED(status):
                    signum = os.WTERMSIG(status)
                    _report(status_fd, f"signaled {signum}\n")
                    os._exit(128 + signum)
                code = os.waitstatus_to_exitcode(status)
                _report(status_fd, f"exited {code}\n")
                os._exit(code)


def main() -> None:
    args = sys.argv[1:]
    ctl_out, go_in, status_fd = int(args[0]), int(args[1]), int(args[2])
    argv = args[4:] if args[3] == "--" else args[3:]
    _unshare_pidns()
    pid = os.fork()
    if pid:
        os.write(ctl_out, f"{pid}\n".encode())
        os._exit(0)
    os.close(ctl_out)
    go = os.read(go_in, 1)
    os.close(go_in)
    if go != b"g":
        os._exit(125)  # the owner gave up before starting us
    _init(argv, status_fd)


if __name__ == "__main__":
    main()
