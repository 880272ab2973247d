"""Every socket CRIU would fail on is named, whatever its state, and those it dumps are not (this test process
holds them)."""

from __future__ import annotations

import os
import re
import socket
import struct
from collections.abc import Iterator

import pytest

from tidal.mechanisms.criu import resources


@pytest.fixture
def held() -> Iterator[dict[str, socket.socket]]:
    server = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    connected = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    closed_by_peer = socket.create_connection(server.getsockname())
    server.accept()[0].close()
    reset_by_peer = socket.create_connection(server.getsockname())
    resetting, _ = server.accept()
    resetting.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    resetting.close()
    assert closed_by_peer.recv(1) == b""  # its peer's FIN is in: CLOSE_WAIT
    with pytest.raises(ConnectionResetError):
        reset_by_peer.recv(1)  # its peer's RST is in: closed, and listed in no table of /proc/net
    socks = {"listen": server, "udp": udp, "established": connected, "accepted": peer,
             "closed-by-peer": closed_by_peer, "reset-by-peer": reset_by_peer,
             "unconnected": socket.socket(socket.AF_INET6, socket.SOCK_STREAM),
             "unix": socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)}
    socks["pair"], socks["pair-other"] = socket.socketpair()
    yield socks
    for s in socks.values():
        s.close()


def test_each_socket_crius_dump_would_fail_on_is_named(held: dict[str, socket.socket]) -> None:
    found = {what: hint for pid, _, what, hint in resources.unsupported([os.getpid()]) if pid == os.getpid()}

    def named(name: str) -> str | None:
        fd = held[name].fileno()
        return next((w for w in found if w.endswith(f"(fd {fd})")), None)

    port = held["listen"].getsockname()[1]
    established = named("established")
    assert established is not None and re.fullmatch(rf"a TCP connection 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:{port} "
                                                     rf"\(fd \d+\)", established)
    assert found[established].startswith("close the connection before a checkpoint can come")
    assert named("unix") is None and named("pair") is None  # CRIU dumps these
    others = {n: named(n) for n in ("listen", "udp", "closed-by-peer", "reset-by-peer", "unconnected")}
    if resources.inet_dumpable():  # a kernel before 6.16: CRIU dumps them
        assert others == dict.fromkeys(others)
        return
    udp_port = held["udp"].getsockname()[1]
    assert others["listen"] == f"a listening TCP socket on 127.0.0.1:{port} (fd {held['listen'].fileno()})"
    assert others["udp"] == f"a UDP socket on 127.0.0.1:{udp_port} (fd {held['udp'].fileno()})"
    assert re.fullmatch(rf"a TCP socket 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:{port} in state CLOSE_WAIT \(fd \d+\)",
                        others["closed-by-peer"] or "")
    for name in ("reset-by-peer", "unconnected"):
        assert re.fullmatch(r"a TCP socket( on \S+)? that is not connected \(or was closed by its peer\) \(fd \d+\)",
                            others[name] or ""), name
    assert all(found[w or ""].startswith("close the socket before a checkpoint can come") for w in others.values())
