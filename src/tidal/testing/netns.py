"""Network namespaces seen from Python: the primitives under :mod:`tidal.testing.hosts`.

A namespace is named as ``ip netns`` names it (``/run/netns/NAME``). A process is started inside one with
``nsenter --net`` (:func:`nsenter_argv`), which changes nothing but the network namespace: ``ip netns exec``
would also mount a fresh ``/sys`` in a mount namespace of its own, which hides ``/sys/fs/cgroup`` (the cgroup
hierarchies Tidal's agents need). Python code runs inside one in a thread of its own (:func:`call_in`): a
socket made there belongs to that namespace wherever it is used afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tidal.errors import TidalError
from tidal.waiting import WaitTimeout, wait_until

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def _command(tool: str, args: Sequence[str], ns: str | None, check: bool) -> subprocess.CompletedProcess[str]:
    argv = [tool, *(["-n", ns] if ns else []), *args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise TidalError(f"`{' '.join(argv)}` exited {p.returncode}: {p.stderr.strip()}",
                         hint="the test hosts need root, iproute2 and a kernel with veth, bridge and htb")
    return p


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip ARGS`` (``ip -n NS ARGS`` inside namespace ``ns``); a :class:`TidalError` with its stderr if it
    fails and ``check``."""
    return _command("ip", args, ns, check)


def tc(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``tc ARGS`` (``tc -n NS ARGS`` inside namespace ``ns``), as :func:`ip`."""
    return _command("tc", args, ns, check)


def nsenter_argv(ns: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` in namespace ``ns`` (``nsenter`` execs it: same pid)."""
    return ["nsenter", f"--net={netns_path(ns)}", "--", *argv]


def enter(ns: str) -> None:
    """Move the calling thread (only it) into namespace ``ns``."""
    fd = os.open(netns_path(ns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise TidalError(f"cannot enter network namespace {ns}: {os.strerror(err)}",
                             hint="entering a network namespace needs root (CAP_SYS_ADMIN)")
    finally:
        os.close(fd)


def call_in(ns: str | None, fn: Callable[[], T]) -> T:
    """``fn()`` run in a new thread inside namespace ``ns`` (``None``: this thread, this process's own
    namespace); its result, or the exception it raised. Sockets it makes stay in ``ns``."""
    if ns is None:
        return fn()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"netns-{ns}", initializer=enter,
                            initargs=(ns,)) as pool:
        return pool.submit(fn).result()


def wait_entered(proc: subprocess.Popen[Any], ns: str, timeout: float = 10.0) -> None:
    """Wait until ``proc`` (started with :func:`nsenter_argv`) is inside namespace ``ns``, or has ended: until
    then it is invisible to :func:`netns_pids`, so nothing could end it with the namespace."""
    target = _ns_id(netns_path(ns))
    wait_until(lambda: proc.poll() is not None or _ns_id(Path(f"/proc/{proc.pid}/ns/net")) == target,
               timeout=timeout, interval=0.001, what=f"process {proc.pid} to enter network namespace {ns}")


def _ns_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # gone, or a zombie (its namespaces are released when it exits)
        return None
    return st.st_dev, st.st_ino


def netns_pids(ns: str) -> list[int]:
    """The processes whose network namespace is ``ns`` (as ``ip netns pids``), never this one."""
    target = _ns_id(netns_path(ns))
    if target is None:
        return []
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and _ns_id(Path("/proc", entry, "ns", "net")) == target:
            pids.append(int(entry))
    return pids


def kill_netns(ns: str, grace: float = 3.0) -> None:
    """End every process in namespace ``ns``: SIGTERM, then SIGKILL to those still there after ``grace``
    seconds, until none is left (new ones forked meanwhile included)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

        def gone(sig: signal.Signals = sig) -> bool:
            left = netns_pids(ns)
            if sig == signal.SIGKILL:  # children forked between the scan and the kill
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            return not left

        with contextlib.suppress(WaitTimeout):
            wait_until(gone, timeout=wait, what=f"the processes of network namespace {ns} to end")
    left = netns_pids(ns)
    if left:
        raise TidalError(f"processes {left} of network namespace {ns} survived SIGKILL",
                         hint="a process in uninterruptible sleep (state D) ends only when its I/O does")


def tcp_reachable(ns: str | None, addr: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection from namespace ``ns`` (``None``: this process's) to ``addr:port`` is
    accepted within ``timeout`` seconds (``ping`` is not installed on these machines)."""
    def attempt() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect((addr, port))
            except OSError:
                return False
            return True

    return call_in(ns, attempt)
