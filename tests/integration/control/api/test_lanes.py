"""What the API does with many requests at once, served by a real HTTP server (with the app's lifespan: its
batchers and its long-polls' signal): heartbeats renewed together, each agent answered for its own node;
submissions committed together, a refused one alone; a long-poll woken by actions for its node, and only for
its node."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update

from tidal.control.store.models import JobRow, NodeRow
from tidal.testing.control import Plane
from tidal.testing.server import served
from tidal.waiting import wait_until

NODES = ("n1", "n2", "n3", "n4")


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Plane, str]]:
    """On SQLite, and on PostgreSQL (a batch's statements are each database's own SQL)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    plane = Plane(tmp_path, url=url)
    try:
        with served(plane.http.app) as url:
            yield plane, url
    finally:
        plane.db.close()


def _agent(plane: Plane, url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers=plane.as_agent(), timeout=30)


def _register(c: httpx.Client, node: str, agent_id: str) -> None:
    r = c.post("/v1/agent/register", json={"name": node, "agent_id": agent_id, "devices": 1, "cpus": [[0]]})
    assert r.status_code == 200, r.text


def _leases(plane: Plane) -> dict[str, tuple[float, int]]:
    with plane.db.read() as s:
        return {n.name: (n.lease_until, n.lease_renewals) for n in s.scalars(select(NodeRow))}


def test_heartbeats_at_once_renew_each_holder_s_lease_and_refuse_the_one_that_lost_it(live: tuple[Plane, str]) -> None:
    plane, url = live
    with _agent(plane, url) as c:
        for n in NODES:
            _register(c, n, f"agent-{n}")
        before = _leases(plane)
        # n4's heartbeat comes from a process that does not hold its lease (replaced, say).
        holders = {n: f"agent-{n}" for n in NODES} | {"n4": "agent-old"}
        go = threading.Barrier(len(NODES) * 5)

        def beat(node: str) -> int:
            go.wait(10)
            return c.post(f"/v1/agent/{node}/heartbeat", json={"agent_id": holders[node]}).status_code

        with ThreadPoolExecutor(len(NODES) * 5) as pool:
            codes = list(pool.map(beat, [n for n in NODES for _ in range(5)]))
    after = _leases(plane)
    assert codes == [200] * 15 + [409] * 5
    for n in ("n1", "n2", "n3"):
        assert after[n][0] > before[n][0] and after[n][1] == before[n][1] + 5, n
    assert after["n4"] == before["n4"]


def test_submissions_at_once_are_kept_but_for_the_one_refused(live: tuple[Plane, str], tmp_path: Path) -> None:
    plane, url = live
    bodies = [{"command": ["train"], "workdir": str(tmp_path), "name": f"j{i}"} for i in range(40)]
    bodies[17]["workdir"] = str(tmp_path / "missing")
    go = threading.Barrier(len(bodies))

    def submit(body: dict[str, Any]) -> httpx.Response:
        with httpx.Client(base_url=url, headers=plane.as_user(), timeout=30) as c:
            go.wait(10)
            return c.post("/v1/jobs", json=body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(submit, bodies))
    assert [a.status_code for a in answers] == [201] * 17 + [422] + [201] * 22
    assert answers[17].json()["message"] == f"workdir {tmp_path / 'missing'} does not exist"
    with plane.db.read() as s:
        stored = {name: seq for name, seq in s.execute(select(JobRow.name, JobRow.seq))}
        assert s.scalar(select(func.count()).select_from(JobRow)) == 39
    assert set(stored) == {f"j{i}" for i in range(40) if i != 17}
    assert sorted(stored.values()) == list(range(1, 40))  # one submission number each, none twice


def test_a_long_poll_is_woken_by_actions_for_its_node_only(live: tuple[Plane, str]) -> None:
    plane, url = live
    with _agent(plane, url) as c:
        _register(c, "n1", "a1")
        _register(c, "n2", "a2")
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            polls = {n: pool.submit(c.get, f"/v1/agent/{n}/actions", params={"agent_id": a, "wait": wait})
                     for n, a, wait in (("n1", "a1", 20.0), ("n2", "a2", 3.0))}
            signal = plane.http.app.state.action_signal
            wait_until(lambda: {"n1", "n2"} <= set(signal._events), timeout=10, what="both polls to wait")
            # One job, placed on n1 by a pass of the scheduler (n2 is drained: nothing new goes there).
            with plane.db.tx() as s:
                s.execute(update(NodeRow).where(NodeRow.name == "n2").values(drain="admin"))
            jid = plane.submit(name="woken")
            plane.rec.once()
            one = polls["n1"].result(20)
            woken_after = time.monotonic() - started
            two = polls["n2"].result(20)
    assert one.status_code == 200 and [a["order"]["job_id"] for a in one.json()] == [jid]
    assert woken_after < 10  # woken by the launch, long before its 20 s
    assert two.status_code == 200 and two.json() == []  # n2 had nothing: its poll ran its 3 s out
