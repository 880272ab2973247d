"""GET /v1/events/stream over a real HTTP server: the events after a given seq, in order, then each new one as
it is recorded; resuming with Last-Event-ID; another user's events never; keep-alive comments while quiet."""

from __future__ import annotations

import json
import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tidal.control import tokens
from tidal.control.api.routes import stream
from tidal.testing.control import Plane
from tidal.testing.server import served
from tidal.waiting import wait_until


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path)
    yield p
    p.db.close()


class Reader:
    """A stream read in a thread: its lines land in a queue."""

    def __init__(self, url: str, token: str, params: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.status: int | None = None
        self._client = httpx.Client(base_url=url, timeout=30)
        self._args = {"params": params or {}, "headers": {"Authorization": f"Bearer {token}", **(headers or {})}}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._client.stream("GET", "/v1/events/stream", **self._args) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    self.lines.put(line)
        except httpx.HTTPError:
            pass

    def events(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The next ``n`` events (their ``data``), checking each ``id`` is its ``seq``."""
        out: list[dict[str, Any]] = []
        seq = None
        while len(out) < n:
            line = self.lines.get(timeout=timeout)
            if line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: "):
                e = json.loads(line[6:])
                assert e["seq"] == seq
                out.append(e)
        return out

    def close(self) -> None:
        self._client.close()


@contextmanager
def reading(url: str, token: str, **kw: Any) -> Iterator[Reader]:
    r = Reader(url, token, **kw)
    try:
        yield r
    finally:
        r.close()


def all_events(p: Plane, after: int = 0) -> list[dict[str, Any]]:
    r = p.http.get("/v1/events", headers=p.as_user(), params={"after": after})
    assert r.status_code == 200
    return r.json()  # type: ignore[no-any-return]


def test_events_after_a_seq_in_order_then_new_ones(plane: Plane) -> None:
    first = plane.submit()
    plane.http.post(f"/v1/jobs/{first}/preempt", headers=plane.as_user())
    plane.http.post(f"/v1/jobs/{first}/resume", headers=plane.as_user())
    logged = all_events(plane)
    assert len(logged) >= 3
    after = logged[0]["seq"]
    with served(plane.http.app) as url, reading(url, plane.user, params={"after": after}) as r:
        got = r.events(len(logged) - 1)
        assert got == logged[1:]
        second = plane.submit()
        (new,) = r.events(1)
        assert new["job"] == second and new["kind"] == "submitted" and new["seq"] > got[-1]["seq"]


def test_last_event_id_resumes_and_without_a_start_only_new_events_come(plane: Plane) -> None:
    jid = plane.submit()
    logged = all_events(plane)
    with served(plane.http.app) as url:
        with reading(url, plane.user, headers={"Last-Event-ID": "0"}) as r:
            assert r.events(len(logged)) == logged
        with reading(url, plane.user) as r:
            wait_until(lambda: r.status == 200, timeout=10, what="the stream to open")
            plane.http.post(f"/v1/jobs/{jid}/cancel", headers=plane.as_user())
            (e,) = r.events(1)
            assert e["kind"] == "cancelled" and e["job"] == jid


def test_a_user_sees_only_their_own_jobs_events_and_an_admin_all(plane: Plane) -> None:
    with plane.db.tx() as s:
        bob = tokens.create_user(s, "bob", "user")
        root = tokens.create_user(s, "root", "admin")
    with served(plane.http.app) as url, reading(url, plane.user, params={"after": 0}) as alice, \
            reading(url, root, params={"after": 0}) as admin:
        theirs = httpx.post(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {bob}"},
                            json={"command": ["x"], "workdir": str(plane.workdir)}).json()["id"]
        mine = plane.submit()
        (e,) = alice.events(1)  # bob's submission came first: alice's first event is her own
        assert e["job"] == mine
        assert [x["job"] for x in admin.events(2)] == [theirs, mine]
        r = httpx.get(f"{url}/v1/events/stream", params={"job": theirs},
                      headers={"Authorization": f"Bearer {plane.user}"})
        assert r.status_code == 404  # another user's job is not disclosed
        assert httpx.get(f"{url}/v1/events/stream").status_code == 401


def test_a_quiet_stream_sends_keep_alive_comments(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "KEEPALIVE_S", 0.3)
    with served(plane.http.app) as url, reading(url, plane.user) as r:
        lines = [r.lines.get(timeout=10) for _ in range(4)]
        assert ": keep-alive" in lines


def test_a_bad_last_event_id_is_refused(plane: Plane) -> None:
    r = plane.http.get("/v1/events/stream", headers={**plane.as_user(), "Last-Event-ID": "x"})
    assert r.status_code == 422 and r.json()["field"] == "Last-Event-ID"


def test_a_client_that_reads_nothing_holds_the_stream_back(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server writes only as fast as the client reads: with 32 MiB of events waiting and a client that reads
    nothing, the stream stops within the connection's buffers and one batch; once read, every event comes, in
    order."""
    from tidal.control.history import record

    jid = plane.submit()
    with plane.db.tx() as s:
        for _ in range(2000):
            record(s, "note", job_id=jid, detail="x" * 16384)
    sent: list[int] = []
    real = stream.sse

    def counted(e: dict[str, Any]) -> bytes:
        sent.append(int(e["seq"]))
        return real(e)

    monkeypatch.setattr(stream, "sse", counted)
    with served(plane.http.app) as url:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        try:
            sock.sendall(f"GET /v1/events/stream?after=0 HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                         f"{plane.user}\r\n\r\n".encode())
            looks: list[int] = []

            def stopped() -> bool:  # the server has stopped writing: two looks, 0.3 s apart, saw the same
                looks.append(len(sent))
                return len(looks) > 1 and looks[-1] == looks[-2] > 0

            wait_until(stopped, timeout=30, interval=0.3, what="the server to stop writing to a client that reads "
                                                               "nothing")
            held = len(sent)
            assert held < 1000, f"{held} of 2001 events sent to a client that read none"
            got = b""
            sock.settimeout(10)
            while got.count(b"\ndata: ") < 2001:
                chunk = sock.recv(1 << 20)
                assert chunk
                got += chunk
            assert sent == sorted(sent) and len(sent) == 2001
        finally:
            sock.close()
