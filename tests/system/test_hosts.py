"""The test hosts themselves (tidal.testing.hosts): they reach each other and only each other, a pulled link
and a bandwidth cap do what they say, the relay delays, nothing is left after a net closes or after its test
process is killed, and PostgreSQL and SeaweedFS serve other hosts and keep their data across a restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tidal.testing import owned_dir, pid_alive, wait_until
from tidal.testing.hosts import Host, TestNet, tcp_reachable
from tidal.testing.hostsweep import find, sweep
from tidal.testing.postgres import PostgresServer
from tidal.testing.relay import Relay
from tidal.testing.seaweedfs import SeaweedFS


def _accept_in_thread(server: socket.socket, handle: Callable[[socket.socket, str], None]) -> threading.Thread:
    """Accept connections on ``server`` until it is closed, each handled in a thread of its own."""
    def loop() -> None:
        while True:
            try:
                conn, (peer, _) = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn, peer), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def _echo(conn: socket.socket, peer: str) -> None:
    with conn:
        while data := conn.recv(1 << 16):
            conn.sendall(data)


def _names_on_machine() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_hosts_reach_each_other_and_nothing_beyond(test_net: TestNet) -> None:
    net = test_net
    peers: dict[str, set[str]] = {h.name: set() for h in net.hosts}
    servers = []
    for h in net.hosts:
        s = h.listen(7000)
        servers.append(s)

        def echo(conn: socket.socket, peer: str, seen: set[str] = peers[h.name]) -> None:
            seen.add(peer)
            _echo(conn, peer)

        _accept_in_thread(s, echo)
    try:
        for a in net.hosts:
            for b in net.hosts:
                with a.connect(b.addr, 7000) as c:
                    c.sendall(b"hello")
                    assert c.recv(5) == b"hello"
            # a process on a host sees that host's network: its address, no default route; and reaches the others
            addrs = a.run(["ip", "-4", "-o", "addr", "show"]).stdout
            assert f"inet {a.addr}/24" in addrs and all(b.addr not in addrs for b in net.hosts if b is not a)
            assert a.run(["ip", "route", "show", "default"]).stdout.strip() == ""
            probe = f"import socket; socket.create_connection(({net.hosts[-1].addr!r}, 7000), timeout=5).close()"
            a.run([sys.executable, "-c", probe])
            # the test process reaches every host
            assert tcp_reachable(None, a.addr, 7000)
        # each server saw every host connect from that host's own address, and the test process from the bridge's
        everyone = {a.addr for a in net.hosts} | {net.gateway}
        wait_until(lambda: all(p == everyone for p in peers.values()), timeout=5, what="every connection accepted")
        # the shared directory is at the same path on every host, for other accounts too
        job = owned_dir(net.shared / "job", "nobody")
        net.hosts[0].run(["runuser", "-u", "nobody", "--", "sh", "-c", f"echo written on h0 > {job}/f"])
        assert net.hosts[-1].run(["runuser", "-u", "nobody", "--", "cat", f"{job}/f"]).stdout == "written on h0\n"
        # every host reaches the bridge's address, in the test process's namespace
        with socket.create_server((net.gateway, 0)) as root_server:
            port = root_server.getsockname()[1]
            assert all(tcp_reachable(h, net.gateway, port) for h in net.hosts)
    finally:
        for s in servers:
            s.close()


def test_a_host_whose_link_is_down_reaches_nobody_and_is_reached_by_nobody(test_net: TestNet) -> None:
    h0, h1, h2 = test_net.hosts
    servers = [h.listen(7000) for h in test_net.hosts]
    try:
        h1.link_down()
        assert not h1.link_is_up
        assert not tcp_reachable(h0, h1.addr, 7000, timeout=0.5)
        assert not tcp_reachable(None, h1.addr, 7000, timeout=0.5)
        assert not tcp_reachable(h1, h0.addr, 7000, timeout=0.5)
        assert not tcp_reachable(h1, h2.addr, 7000, timeout=0.5)
        assert tcp_reachable(h0, h2.addr, 7000) and tcp_reachable(h1, h1.addr, 7000)
        h1.link_up()
        wait_until(lambda: tcp_reachable(h0, h1.addr, 7000) and tcp_reachable(h1, h2.addr, 7000), timeout=10,
                   what="h1 reachable again once its link is up")
    finally:
        for s in servers:
            s.close()


def _transfer_seconds(src: Host, dst: Host, nbytes: int) -> float:
    """Seconds to send ``nbytes`` from ``src`` to ``dst`` over TCP (connect to the last byte received)."""
    received = []

    with dst.listen() as server:
        port = server.getsockname()[1]

        def sink(conn: socket.socket, peer: str) -> None:
            n = 0
            with conn:
                while data := conn.recv(1 << 16):
                    n += len(data)
            received.append((n, time.monotonic()))

        _accept_in_thread(server, sink)
        start = time.monotonic()
        with src.connect(dst.addr, port) as c:
            c.sendall(b"x" * nbytes)
            c.shutdown(socket.SHUT_WR)
            wait_until(lambda: received, timeout=60, what=f"{nbytes} bytes from {src.name} at {dst.name}")
    assert received[0][0] == nbytes
    return received[0][1] - start


def test_a_bandwidth_cap_caps_throughput(test_net: TestNet) -> None:
    h0, h1, h2 = test_net.hosts
    nbytes, rate_bits = 1_000_000, 8_000_000  # 1 MB at 8 Mbit/s: 1 s
    ideal = nbytes * 8 / rate_bits
    free = _transfer_seconds(h0, h1, nbytes)
    test_net.cap(h0, h1, "8mbit")
    capped = _transfer_seconds(h0, h1, nbytes)
    back = _transfer_seconds(h1, h0, nbytes)
    other = _transfer_seconds(h0, h2, nbytes)  # not between h0 and h1: not capped
    assert capped >= ideal / 2 and back >= ideal / 2, (capped, back, ideal)
    assert free < ideal / 2 and other < ideal / 2, (free, other)
    test_net.uncap(h0, h1)
    assert _transfer_seconds(h0, h1, nbytes) < ideal / 2
    h2.cap("8mbit")  # everything h2 sends and receives
    assert _transfer_seconds(h0, h2, nbytes) >= ideal / 2
    assert _transfer_seconds(h2, h1, nbytes) >= ideal / 2
    h2.uncap()
    assert _transfer_seconds(h2, h1, nbytes) < ideal / 2


def test_the_relay_adds_its_delay_each_way(test_net: TestNet) -> None:
    h0, h1, h2 = test_net.hosts
    delay = 0.2
    with h2.listen(7000) as server:
        _accept_in_thread(server, _echo)
        with Relay((h2.addr, 7000), delay, host=h1) as relay:
            assert relay.addr == h1.addr

            def round_trip(addr: str, port: int, payload: bytes) -> float:
                with h0.connect(addr, port) as c:
                    start = time.monotonic()
                    c.sendall(payload)
                    got = b""
                    while len(got) < len(payload):
                        got += c.recv(1 << 16)
                    assert got == payload
                    return time.monotonic() - start

            direct = round_trip(h2.addr, 7000, b"ping")
            relayed = round_trip(relay.addr, relay.port, b"ping")
            assert direct < delay / 2 and 2 * delay <= relayed < 2 * delay + 1.0, (direct, relayed)
            big = os.urandom(2_000_000)  # a stream is shifted, not slowed, and arrives intact
            assert round_trip(relay.addr, relay.port, big) < 2 * delay + 2.0
    assert not pid_alive(relay.proc.pid)


def test_closing_removes_every_namespace_link_process_and_directory() -> None:
    with pytest.raises(RuntimeError, match="the test failed"), TestNet(n_hosts=2, name_prefix="tidalt") as net:
        h0, h1 = net.hosts
        procs = [h.popen(["sleep", "600"]) for h in net.hosts]
        grandchild = h0.popen(["sh", "-c", "sleep 600 & wait"])  # a process the net did not start itself
        relay = Relay((h1.addr, 1), 0.1, host=h0)
        net.cap(h0, h1, "10mbit")
        h1.cap("20mbit")
        owned_dir(net.shared / "job", "nobody")
        tag, shared = net.tag, net.shared
        assert net.leftovers().namespaces == [h0.netns, h1.netns]
        wait_until(lambda: len(h0.pids()) == 4, timeout=10, what="h0's sleep, sh and its sleep, and the relay")
        assert len(h1.pids()) == 1
        pids = h0.pids() + h1.pids()
        assert tag in _names_on_machine()
        raise RuntimeError("the test failed")
    assert not find(tag), find(tag)
    assert tag not in _names_on_machine()
    assert not shared.exists()
    assert not any(pid_alive(p) for p in pids)
    assert all(p.returncode is not None for p in [*procs, grandchild, relay.proc])


_OWNER = textwrap.dedent("""
    import sys, time
    from tidal.testing.hosts import TestNet
    with TestNet(n_hosts=2, watchdog=sys.argv[1] == "watchdog") as net:
        for h in net.hosts:
            h.popen(["sleep", "600"])
        print(net.tag, flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize(("sig", "watchdog"), [(signal.SIGKILL, False), (signal.SIGKILL, True),
                                               (signal.SIGTERM, False)])
def test_what_a_killed_test_process_left_is_removed(sig: signal.Signals, watchdog: bool) -> None:
    """SIGKILL: without a watchdog, by the next sweep; with one (the default), as soon as the owner dies.
    SIGTERM: by the owner itself, on its way out."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, "watchdog" if watchdog else "none"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert owner.stdout is not None
    tag = owner.stdout.readline().strip()
    try:
        left = find(tag)[tag]  # popen returns once the process is on its host
        assert len(left.namespaces) == 2 and len(left.links) == 3 and left.dir and len(left.pids) == 2
    finally:
        owner.send_signal(sig)
        owner.wait(30)
    if sig == signal.SIGTERM:
        assert not find(tag)
    elif watchdog:
        wait_until(lambda: not find(tag), timeout=20, what=f"the watchdog to remove test net {tag}")
    else:
        assert find(tag)[tag].pids == left.pids  # nobody removed them: the owner had no chance
        assert tag in sweep()
        assert not find(tag)
    assert not any(pid_alive(p) for p in left.pids)
    assert tag not in _names_on_machine()


@pytest.mark.postgres
def test_postgres_on_a_host_serves_the_others_and_keeps_its_data_across_restarts(test_net: TestNet) -> None:
    import psycopg

    db_host, client = test_net.hosts[0], test_net.hosts[1]
    pg = PostgresServer(host=db_host)
    assert pg.addr == db_host.addr and pg.port == 5432
    url = pg.create_database("app").replace("postgresql+psycopg://", "postgresql://")

    def query(sql: str) -> list[tuple[object, ...]]:
        conn = client.call(lambda: psycopg.connect(url, autocommit=True, connect_timeout=5))
        with conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    query("CREATE TABLE t (x int)")
    query("INSERT INTO t VALUES (1), (2)")
    assert query("SELECT inet_client_addr()::text")[0][0].startswith(client.addr)
    pg.restart()
    assert query("SELECT sum(x) FROM t") == [(3,)]
    query("INSERT INTO t VALUES (3)")
    pg.restart("immediate")  # as a crash: recovered from the WAL
    assert query("SELECT sum(x) FROM t") == [(6,)]
    data = pg.dir
    test_net.close()  # stops it through the net
    assert not data.exists() and pg.proc is None


_S3_CLIENT = textwrap.dedent("""
    import json, sys
    import s3fs
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **json.loads(sys.argv[1]))
    for step in sys.argv[2:]:
        action, url = step.split(" ")
        path = url.removeprefix("s3://")
        if action == "put":
            fs.pipe(url, b"payload " * 1000)
        elif action == "check":
            assert fs.cat(url) == b"payload " * 1000, url
            assert path in fs.ls(path.rsplit("/", 1)[0], refresh=True), url
        elif action == "gone":
            assert not fs.exists(url), url
        elif action == "delete":
            fs.rm(url)
    print("ok")
""")


@pytest.mark.slow  # 10-20 s: SeaweedFS starts twice, three clients import s3fs
def test_seaweedfs_on_a_host_serves_the_others_and_keeps_objects_across_a_restart(test_net: TestNet) -> None:
    s3_host, a, b = test_net.hosts
    s3 = SeaweedFS(host=s3_host)
    assert s3.endpoint_url == f"http://{s3_host.addr}:8333"
    opts = json.dumps(s3.storage_options())

    def client(host: Host, *steps: str) -> None:
        argv = [sys.executable, "-c", _S3_CLIENT, opts, *(f"{a} {s3.url(k)}" for a, k in map(str.split, steps))]
        assert host.run(argv).stdout.strip() == "ok"

    client(a, "put run/one", "put run/two")
    client(b, "check run/one", "check run/two", "delete run/two", "gone run/two")
    s3.shutdown()
    assert not tcp_reachable(a, s3_host.addr, 8333)
    s3.start()
    client(b, "check run/one", "gone run/two", "delete run/one", "gone run/one")
    data = s3.dir
    test_net.close()  # stops it through the net
    assert s3.proc is None and not data.exists()


def test_seaweedfs_on_loopback(seaweedfs: SeaweedFS) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **seaweedfs.storage_options())
    bucket = seaweedfs.create_bucket("loopback-test")
    url = seaweedfs.url("a/b", bucket=bucket)
    fs.pipe(url, b"data")
    assert fs.cat(url) == b"data"
    assert fs.ls(f"{bucket}/a", refresh=True) == [f"{bucket}/a/b"]
    seaweedfs.restart(kill=True)  # as a crash
    assert fs.cat(url) == b"data"
    fs.rm(url)
    assert not fs.exists(url)
    # another process finds it through the AWS variables alone
    script = "import s3fs; fs = s3fs.S3FileSystem(); fs.pipe('s3://%s/env', b'1'); print(fs.cat('s3://%s/env'))"
    out = subprocess.run([sys.executable, "-c", script % (bucket, bucket)], capture_output=True, text=True,
                         env={**os.environ, **seaweedfs.env()}, check=True, timeout=60).stdout
    assert out.strip() == "b'1'"
    # its gRPC sockets are in a /tmp of its own, not the machine's
    assert not [p for port in seaweedfs.grpc_ports.values() for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
