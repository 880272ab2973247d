"""The rendezvous store of distributed jobs, hosted by Tidal (not by rank 0, which may move).

``python -m tidal.mechanisms.interpose.storeserver`` serves a torch ``TCPStore`` on loopback, prints
its port, and exits when its standard input closes (its owner is gone). Jobs share it: each build of a
job's process group uses its own key prefix.

The control plane's store must outlive the control plane itself: ranks restored (or going on after a
checkpoint) rebuild their group on the address they were given, maybe after the control plane that gave it
was killed. So once :func:`hold` names a state file, the store server is started detached, with
``--lifeline FILE``: it lives while some process holds a lock on FILE (every control plane of that state
directory does, for its whole life) and for a grace period after the last one let go. A restarted control
plane adopts it, keys and all, from the same file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tidal.errors import MechanismError

STATE = "rendezvous.json"  # in the control plane's state directory: {"pid", "port"}, and the lifeline lock
GRACE_S = 600.0  # how long a store whose control plane is gone waits for a new one


class RendezvousServer:
    """A store server process: started here (owned by this process through its standard input, or detached
    with a ``lifeline``), or adopted from an earlier owner (:meth:`adopted`)."""

    def __init__(self, python: str = sys.executable, *, port: int = 0, lifeline: Path | None = None,
                 log: Path | None = None) -> None:
        argv = [python, "-m", "tidal.mechanisms.interpose.storeserver", "--port", str(port)]
        if lifeline is not None:
            argv += ["--lifeline", str(lifeline)]
        with contextlib.ExitStack() as files:
            err = files.enter_context(open(log, "ab")) if log is not None else subprocess.PIPE
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                argv, stdin=subprocess.PIPE if lifeline is None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=err, text=True, start_new_session=lifeline is not None)
        proc = self.proc
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            detail = proc.stderr.read() if proc.stderr else f"see {log}"
            proc.kill()
            proc.wait()
            raise MechanismError(f"the rendezvous store did not start: {line or detail.strip()[-300:]}",
                                 hint="distributed jobs need PyTorch installed where the agent runs")
        if lifeline is not None:
            proc.stdout.close()  # it prints nothing more; it must not die writing to a closed pipe either
        self.pid = proc.pid
        self.port = int(line)
        self.addr = f"127.0.0.1:{self.port}"

    @classmethod
    def adopted(cls, pid: int, port: int) -> RendezvousServer:
        """The store server ``pid`` an earlier owner started, serving on ``port``."""
        self = cls.__new__(cls)
        self.proc, self.pid, self.port, self.addr = None, pid, port, f"127.0.0.1:{port}"
        return self

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return _is_store_server(self.pid)

    def close(self) -> None:
        if self.proc is None:
            if _is_store_server(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGTERM)
            return
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            else:
                self.proc.terminate()
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()


def _is_store_server(pid: int) -> bool:
    """A live (not zombie) store server process, not some process that reused the pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and b"tidal.mechanisms.interpose.storeserver" in cmdline


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False


_lock = threading.Lock()
_server: RendezvousServer | None = None
_state: tuple[Path, int] | None = None  # the state file this process holds (locked shared), and its fd
_fixed_port = 0  # the port the store must listen on (an operator's firewall rules name it); 0: any, then kept


def hold(home: Path, port: int = 0) -> None:
    """Make this process an owner of the store server recorded under ``home`` (the control plane calls it
    at start): it keeps a shared lock on the state file until it exits, however it exits. ``port``: the
    port a store it starts must listen on (0: a free one the first time, then the same one again)."""
    global _state, _fixed_port
    if not 0 <= port <= 65535:
        raise MechanismError(f"rendezvous store port {port}: from 1 to 65535 (0: any free port)")
    _fixed_port = port
    path = home / STATE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    with _lock:
        _state = (path, fd)


def _recorded() -> dict[str, int]:
    assert _state is not None
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        d = json.loads(os.pread(_state[1], 4096, 0) or b"{}")
        return {"pid": int(d["pid"]), "port": int(d["port"])}
    return {}


def _start_held() -> RendezvousServer:
    assert _state is not None
    path, fd = _state
    before = _recorded()
    if before and _is_store_server(before["pid"]) and _answers(before["port"]):
        return RendezvousServer.adopted(before["pid"], before["port"])
    log = path.parent / "logs" / "rendezvous.log"
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = None
    if _fixed_port:
        try:
            server = RendezvousServer(port=_fixed_port, lifeline=path, log=log)
        except MechanismError as exc:
            raise MechanismError(f"the rendezvous store cannot listen on port {_fixed_port}: {exc.message}",
                                 hint="free the port, or give the control plane another --rendezvous-port "
                                      "(and open it to the nodes)") from None
    elif before:
        # The same address as before, where it is free: a rank that is still trying to reach the store it
        # was given then finds one (the keys written to the old one are gone, though).
        with contextlib.suppress(MechanismError):
            server = RendezvousServer(port=before["port"], lifeline=path, log=log)
    server = server or RendezvousServer(lifeline=path, log=log)
    # In place: the lock is on this very file, so it must not be replaced.
    data = json.dumps({"pid": server.pid, "port": server.port}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    return server


def shared() -> RendezvousServer:
    """This process's store server, started on first use (and again if it died); adopted from an earlier
    control plane of the same state directory after :func:`hold`."""
    global _server
    with _lock:
        if _server is None or not _server.alive():
            _server = _start_held() if _state is not None else RendezvousServer()
        return _server


def shared_alive() -> bool:
    """Whether this process has a store server (started or adopted) that still runs."""
    with _lock:
        return _server is not None and _server.alive()


def close_shared() -> None:
    """Stop this process's store server, or the one it holds but has not needed yet (a control plane
    shutting down on purpose)."""
    global _server
    with _lock:
        if _server is None and _state is not None and (d := _recorded()):
            _server = RendezvousServer.adopted(d["pid"], d["port"])
        if _server is not None:
            _server.close()
            _server = None


def stop_recorded(home: Path) -> None:
    """Stop the store server recorded under ``home``, if it still runs (``tidal down``)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        pid = int(json.loads((home / STATE).read_text())["pid"])
        RendezvousServer.adopted(pid, 0).close()


def _held_by_others(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _live_while_held(lifeline: Path, grace: float) -> None:
    fd = os.open(lifeline, os.O_RDONLY | os.O_CLOEXEC)
    last = time.monotonic()
    while time.monotonic() - last < grace:
        time.sleep(0.5)
        if _held_by_others(fd):
            last = time.monotonic()


def main() -> None:
    ap = argparse.ArgumentParser(prog="tidal-rendezvous")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--lifeline", type=Path, default=None, help="live while a lock on this file is held")
    ap.add_argument("--grace", type=float, default=GRACE_S, help="seconds to wait for a new holder")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    store = TCPStore("127.0.0.1", args.port, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=300))
    print(store.port, flush=True)
    if args.lifeline is None:
        sys.stdin.read()  # until the owner closes it or dies
    else:
        _live_while_held(args.lifeline, args.grace)
    del store


if __name__ == "__main__":
    main()
