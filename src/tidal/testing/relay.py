"""A TCP relay that delays what it forwards: latency between test hosts, which this kernel cannot add with
``netem``.

::

    with Relay(("198.18.0.12", 5432), delay=0.05, host=net["h1"]) as relay:   # listens on h1's address
        url = f"postgresql://{relay.addr}:{relay.port}/db"                     # 50 ms each way, on top

Every chunk of bytes read from one side is written to the other ``delay`` seconds later (in order; the
relay does not slow a stream down, it only shifts it), in both directions, so a request and its answer
take ``2 * delay`` longer. Connecting is not delayed (the kernel completes the handshake before the relay
sees the connection); the relay's own connection to the target is made when the client's is accepted.
The relay is a process (``python -m tidal.testing.relay --listen ADDR:PORT --to ADDR:PORT --delay S``)
started on ``host`` (``None``: on this machine's loopback), ended by :meth:`Relay.stop` or with the host.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from tidal.errors import TidalError

if TYPE_CHECKING:
    from tidal.testing.hosts import Host


class Relay:
    """A delaying relay listening on ``host``'s address (``None``: 127.0.0.1) at ``port`` (0: a free one),
    forwarding to ``target`` (``(address, port)``); :attr:`addr` and :attr:`port` say where it listens."""

    def __init__(self, target: tuple[str, int], delay: float, *, host: Host | None = None, port: int = 0) -> None:
        self.target, self.delay = target, delay
        listen = f"{host.addr if host else '127.0.0.1'}:{port}"
        argv = [sys.executable, "-m", "tidal.testing.relay", "--listen", listen, "--to", f"{target[0]}:{target[1]}",
                "--delay", str(delay)]
        if host is not None:
            self.proc: subprocess.Popen[str] = host.popen(argv, stdout=subprocess.PIPE, text=True)
        else:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""  # "listening ADDR:PORT", or nothing if it failed
        if not line.startswith("listening "):
            self.stop()
            raise TidalError(f"the relay to {target[0]}:{target[1]} did not start (it said {line!r})")
        self.addr, _, p = line.split()[1].rpartition(":")
        self.port = int(p)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _pump(src: socket.socket, dst: socket.socket, delay: float, done: threading.Semaphore) -> None:
    """Copy ``src`` to ``dst``, each chunk ``delay`` seconds after it was read; then half-close ``dst``."""
    chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def write() -> None:
        try:
            while True:
                due, data = chunks.get()
                time.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            done.release()

    threading.Thread(target=write, daemon=True).start()
    try:
        while True:
            data = src.recv(1 << 16)
            chunks.put((time.monotonic() + delay, data))
            if not data:
                return
    except OSError:
        chunks.put((time.monotonic(), b""))


def _relay(client: socket.socket, target: tuple[str, int], delay: float) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    done = threading.Semaphore(0)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pump, args=(client, upstream, delay, done), daemon=True).start()
    threading.Thread(target=_pump, args=(upstream, client, delay, done), daemon=True).start()
    done.acquire()
    done.acquire()
    client.close()
    upstream.close()


def _address(text: str) -> tuple[str, int]:
    addr, _, port = text.rpartition(":")
    return addr, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tidal.testing.relay",
                                     description="A TCP relay that delays what it forwards, both ways.")
    parser.add_argument("--listen", type=_address, required=True, metavar="ADDR:PORT")
    parser.add_argument("--to", type=_address, required=True, metavar="ADDR:PORT")
    parser.add_argument("--delay", type=float, required=True, metavar="SECONDS")
    args = parser.parse_args(argv)
    server = socket.create_server(args.listen, backlog=128)
    addr, port = server.getsockname()[:2]
    print(f"listening {addr}:{port}", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_relay, args=(client, args.to, args.delay), daemon=True).start()


if __name__ == "__main__":
    main()
