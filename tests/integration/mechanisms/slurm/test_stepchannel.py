"""The connection between the tasks of a multi-node ``tidal run`` step, over real sockets on loopback: only a
task that knows the run's secret gets in, messages are bounded, requests get their replies and events pass."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from tidal.errors import MechanismError
from tidal.mechanisms.slurm import stepchannel
from tidal.mechanisms.slurm.stepchannel import ChannelClosed, Connection, accept, connect, mac
from tidal.waiting import wait_until

SECRET = b"s" * 32


def _server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))
    return server, server.getsockname()[1]


def _accept_in_thread(server: socket.socket, timeout: float = 10) -> dict[str, Any]:
    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["conn"], got["task"] = accept(server, SECRET, timeout)
        except MechanismError as exc:
            got["error"] = exc.message

    t = threading.Thread(target=run)
    t.start()
    got["thread"] = t
    return got


def test_a_task_with_the_secret_gets_in_and_requests_and_events_pass() -> None:
    server, port = _server()
    got = _accept_in_thread(server)
    member = connect("127.0.0.1", port, SECRET, 3, timeout=10)
    got["thread"].join(10)
    coord: Connection = got["conn"]
    assert got["task"] == 3 and coord.name.startswith("task 3 ")
    events: list[dict[str, Any]] = []
    threading.Thread(target=member.serve, args=(lambda m: {"echo": m["op"]}, events.append), daemon=True).start()
    seen: list[dict[str, Any]] = []
    threading.Thread(target=coord.serve, args=(lambda m: {}, seen.append), daemon=True).start()
    assert coord.request({"op": "counts"}, timeout=10)["echo"] == "counts"
    member.send({"event": "stop", "signal": "SIGTERM"})
    member.close()
    wait_until(lambda: len(seen) >= 2, timeout=10, what="the event and the end of the connection")
    assert seen[0] == {"event": "stop", "signal": "SIGTERM"}
    assert "closed" in seen[1]
    with pytest.raises(ChannelClosed):
        coord.request({"op": "park"}, timeout=5)
    server.close()


def test_a_peer_without_the_secret_is_turned_away_and_the_next_one_gets_in() -> None:
    server, port = _server()
    got = _accept_in_thread(server)
    intruder = socket.create_connection(("127.0.0.1", port))
    f = intruder.makefile("rb")
    assert b"nonce" in f.readline()
    intruder.sendall(b'{"task": 1, "mac": "' + mac(b"wrong" * 7, b"x").encode() + b'"}\n')
    assert f.readline() == b""  # closed on it
    member = connect("127.0.0.1", port, SECRET, 1, timeout=10)
    got["thread"].join(10)
    assert got["task"] == 1
    member.close()
    got["conn"].close()
    server.close()


def test_an_oversized_or_malformed_line_ends_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stepchannel, "MAX_LINE", 64)
    for junk, why in ((b"x" * 100 + b"\n", "over 64 bytes"), (b"[1, 2]\n", "not a JSON object")):
        a, b = socket.socketpair()
        conn = Connection(a, "task 1")
        b.sendall(junk)
        with pytest.raises(ChannelClosed, match=why):
            conn.read()
        assert conn.closed.is_set()
        b.close()


def test_no_task_connecting_in_time_is_a_clear_error() -> None:
    server, _ = _server()
    with pytest.raises(MechanismError, match="no task of the step connected within 1 s"):
        accept(server, SECRET, 1)
    server.close()
