"""The rendezvous store of distributed jobs, hosted by Tidal (not by rank 0, which may move).

``python -m tidal.mechanisms.interpose.storeserver`` serves a torch ``TCPStore`` on loopback, prints
its port, and exits when its standard input closes (its owner is gone). Jobs share it: each build of a
job's process group uses its own key prefix.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading

from tidal.errors import MechanismError


class RendezvousServer:
    """A store server process owned by this process."""

    def __init__(self, python: str = sys.executable) -> None:
        self.proc = subprocess.Popen([python, "-m", "tidal.mechanisms.interpose.storeserver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise MechanismError(f"the rendezvous store did not start: {line or err.strip()[-300:]}",
                                 hint="distributed jobs need PyTorch installed where the agent runs")
        self.port = int(line)
        self.addr = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()


_lock = threading.Lock()
_server: RendezvousServer | None = None


def shared() -> RendezvousServer:
    """This process's store server, started on first use (and again if it died)."""
    global _server
    with _lock:
        if _server is None or _server.proc.poll() is not None:
            _server = RendezvousServer()
        return _server


def main() -> None:
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    print(store.port, flush=True)
    sys.stdin.read()  # until the owner closes it or dies
    del store


if __name__ == "__main__":
    main()
