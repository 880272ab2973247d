"""The connection between the ``tidal run`` tasks of one Slurm step: task 0 (the coordinator) listens, each
other task connects to it over the cluster's network.

JSON lines, each at most :data:`MAX_LINE` bytes; a longer line or one that is not a JSON object ends the
connection. Whoever connects proves that it knows the run's secret before anything else is read from it: the
coordinator sends a fresh nonce, the task answers with its HMAC under the secret (the secret itself never
crosses the network). The secret travels through the checkpoint store, which only the job's owner reads (see
:mod:`tidal.mechanisms.slurm.multitask`).

Requests carry an ``id`` that their reply names (``re``); a message without either is an event.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import json
import queue
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

from tidal.errors import MechanismError

MAX_LINE = 1 << 20  # a reply names at most one part and the ranks of one node
HELLO_TIMEOUT_S = 30.0


class ChannelClosed(MechanismError):
    """The other task's connection ended (its node or its ``tidal run`` is gone)."""


def mac(secret: bytes, nonce: bytes) -> str:
    return hmac.new(secret, b"tidal-run-step\0" + nonce, hashlib.sha256).hexdigest()


class Connection:
    """One end of a task's connection: requests with replies, and events, both ways."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock, self.name = sock, name
        self._file = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._mu = threading.Lock()
        self.closed = threading.Event()

    # -- framing --------------------------------------------------------------------------------------
    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        if len(data) > MAX_LINE:
            raise MechanismError(f"a message to {self.name} is {len(data)} bytes, over {MAX_LINE}")
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as exc:
            self.close()
            raise ChannelClosed(f"the connection to {self.name} ended: {exc}") from None

    def read(self) -> dict[str, Any]:
        """The next message; :class:`ChannelClosed` at the end, or on a line that breaks the rules."""
        try:
            line = self._file.readline(MAX_LINE + 1)
        except OSError as exc:
            self.close()
            raise ChannelClosed(f"the connection to {self.name} ended: {exc}") from None
        if not line:
            self.close()
            raise ChannelClosed(f"the connection to {self.name} ended")
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            self.close()
            raise ChannelClosed(f"{self.name} sent a line over {MAX_LINE} bytes; connection closed")
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self.close()
            raise ChannelClosed(f"{self.name} sent something that is not a JSON object; connection closed")
        return msg

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._mu:
            waiting, self._waiting = self._waiting, {}
        for q in waiting.values():
            q.put({"closed": True})

    # -- requests and events --------------------------------------------------------------------------
    def serve(self, on_request: Callable[[dict[str, Any]], dict[str, Any]],
              on_event: Callable[[dict[str, Any]], None]) -> None:
        """Read until the connection ends (then ``on_event({"closed": ...})``): replies go to who waits for
        them, events to ``on_event``, requests to ``on_request`` in a thread each (a request may wait for
        long, e.g. a dump) whose result is the reply."""
        try:
            while True:
                msg = self.read()
                re_ = msg.get("re")
                if isinstance(re_, int):
                    with self._mu:
                        q = self._waiting.pop(re_, None)
                    if q is not None:
                        q.put(msg)
                elif isinstance(msg.get("id"), int):
                    threading.Thread(target=self._answer, args=(on_request, msg), daemon=True,
                                     name=f"tidal-step-{msg.get('op')}").start()
                else:
                    on_event(msg)
        except ChannelClosed as exc:
            on_event({"closed": exc.message})

    def _answer(self, on_request: Callable[[dict[str, Any]], dict[str, Any]], msg: dict[str, Any]) -> None:
        try:
            reply = on_request(msg)
        except Exception as exc:  # the requester learns what went wrong here
            reply = {"error": getattr(exc, "message", None) or str(exc) or type(exc).__name__,
                     "kind": type(exc).__name__}
        with contextlib.suppress(ChannelClosed):
            self.send({**reply, "re": msg["id"]})

    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a request and wait for its reply (:class:`ChannelClosed` if the connection ends first)."""
        rid = next(self._ids)
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._mu:
            if self.closed.is_set():
                raise ChannelClosed(f"the connection to {self.name} has ended")
            self._waiting[rid] = q
        self.send({**msg, "id": rid})
        try:
            reply = q.get(timeout=timeout)
        except queue.Empty:
            with self._mu:
                self._waiting.pop(rid, None)
            raise MechanismError(f"{self.name} did not answer {msg.get('op')!r} within {timeout:.0f} s") from None
        if reply.get("closed"):
            raise ChannelClosed(f"the connection to {self.name} ended before it answered {msg.get('op')!r}")
        return reply


def accept(server: socket.socket, secret: bytes, timeout: float) -> tuple[Connection, int]:
    """The next task that proves it knows ``secret``: its connection and its task number. Connections that
    do not are closed and skipped."""
    server.settimeout(timeout)
    while True:
        try:
            sock, peer = server.accept()
        except TimeoutError:
            raise MechanismError(f"no task of the step connected within {timeout:.0f} s") from None
        sock.settimeout(HELLO_TIMEOUT_S)
        conn = Connection(sock, f"{peer[0]}:{peer[1]}")
        nonce = secrets.token_bytes(16)
        try:
            conn.send({"nonce": nonce.hex()})
            hello = conn.read()
        except (ChannelClosed, OSError):
            conn.close()
            continue
        task = hello.get("task")
        proof = hello.get("mac")
        if not isinstance(task, int) or not isinstance(proof, str) \
                or not hmac.compare_digest(proof, mac(secret, nonce)):
            conn.close()
            continue
        sock.settimeout(None)
        conn.name = f"task {task} ({peer[0]})"
        return conn, task


def connect(addr: str, port: int, secret: bytes, task: int, timeout: float) -> Connection:
    """Connect task ``task`` to the coordinator and prove it knows ``secret``."""
    try:
        sock = socket.create_connection((addr, port), timeout=timeout)
    except OSError as exc:
        raise ChannelClosed(f"cannot reach the step's coordinator at {addr}:{port}: {exc}") from None
    conn = Connection(sock, f"the coordinator ({addr}:{port})")
    try:
        first = conn.read()
        nonce = bytes.fromhex(str(first.get("nonce", "")))
        conn.send({"task": task, "mac": mac(secret, nonce)})
    except (ValueError, OSError) as exc:
        conn.close()
        raise ChannelClosed(f"the coordinator at {addr}:{port} did not greet as expected: {exc}") from None
    sock.settimeout(None)
    return conn
