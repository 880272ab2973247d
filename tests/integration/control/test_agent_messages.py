"""The control plane's side of the agent protocol, on a real control plane (API, SQLite database): agent
messages of another protocol version are refused with a 426 that says so; actions are handed out as
protocol actions (older rows, and orders it cannot read, included); an action's result is checked against
its kind of order before it is applied; exit reports are typed; time comes from the database's clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.integration.control.api.test_fuzz import raw
from tidal.control import agents
from tidal.control.store.models import ActionRow, NodeRow
from tidal.core import protocol
from tidal.errors import ValidationError
from tidal.testing.control import FakeAgent, Plane, start
from tidal.testing.server import served


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path)
    yield p
    p.db.close()


class FixedClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t


def test_agent_messages_of_another_version_are_refused_with_a_426(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    assert a.register() == 200
    jid = plane.submit()
    act = start(plane, a, jid)
    bodies: dict[str, dict[str, Any]] = {
        "/v1/agent/register": {"name": "node-1", "agent_id": "A", "devices": 1, "cpus": [[0]]},
        "/v1/agent/node-1/heartbeat": {"agent_id": "A", "jobs": {}},
        "/v1/agent/node-1/results": {"agent_id": "A", "action_id": act["id"], "ok": True,
                                     "data": {"ranks": [{"rank": 0, "pid": 1}]}},
        "/v1/agent/node-1/exits": {"agent_id": "A", "job_id": jid, "attempt": 1, "ranks": [{"rank": 0, "code": 0}]},
        "/v1/agent/node-1/leave": {"agent_id": "A"},
    }
    with served(plane.http.app) as url, httpx.Client(base_url=url, headers=plane.as_agent(), timeout=30) as http:
        for path, body in bodies.items():
            r = http.post(path, json={**body, "v": 2})
            assert r.status_code == 426, (path, r.text)
            err = r.json()
            assert err["error"] == "ProtocolMismatch" and err["version"] == 2 and err["accepted"] == [1]
            assert "speaks protocol version 2; this Tidal speaks version 1" in err["message"], err
            assert "same Tidal release" in err["hint"]
        # The same messages of this version are taken (the leave last: it gives the node up).
        for path, body in bodies.items():
            r = http.post(path, json={**body, "v": protocol.VERSION})
            assert r.status_code == 200, (path, r.text)
    j = plane.job(jid)
    assert j["state"] == "succeeded"


def test_actions_are_handed_out_as_protocol_actions(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    plane.rec.once()
    with plane.db.tx() as s:
        (row,) = s.scalars(select(ActionRow).where(ActionRow.job_id == jid))
        stored = dict(row.payload)
        # Rows an older control plane wrote: no kind in the payload (the row's kind says it).
        s.add(ActionRow(id="a-old", job_id=jid, node="node-1", kind="kill", op="a-old", status="pending",
                        payload={"job_id": jid, "attempt": 1}, created_at=time.time() + 1))
        # An order this control plane cannot read: handed out as stored, for the agent to refuse.
        s.add(ActionRow(id="a-bad", job_id=jid, node="node-1", kind="launch", op="a-bad", status="pending",
                        payload={"job_id": jid, "attempt": 1, "argv": []}, created_at=time.time() + 2))
    r = plane.http.get("/v1/agent/node-1/actions", headers=plane.as_agent(), params={"agent_id": "A"})
    launch, old, bad = r.json()
    assert launch == protocol.encode(protocol.decode_action(launch))
    assert launch["v"] == protocol.VERSION and launch["order"] == stored and stored["kind"] == "launch"
    assert old == {"v": 1, "id": "a-old", "order": {"kind": "kill", "job_id": jid, "attempt": 1, "report": False}}
    assert bad == {"v": 1, "id": "a-bad", "order": {"kind": "launch", "job_id": jid, "attempt": 1, "argv": []}}
    with pytest.raises(ValidationError):
        protocol.decode_action(bad)


def test_a_result_is_checked_against_its_kind_of_order_before_it_is_applied(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    plane.rec.once()
    (act,) = a.actions()

    def post(ok: bool, data: dict[str, Any]) -> httpx.Response:
        return plane.http.post("/v1/agent/node-1/results", headers=plane.as_agent(), json={
            "agent_id": "A", "action_id": act["id"], "ok": ok, "data": data, "error": None if ok else "boom"})

    for data, field in (({"ranks": [{"rank": 0, "pid": 0}]}, "ranks.0.pid"),
                        ({"checkpoint": {"id": "c", "created_at": 1, "bytes": 1, "stored_bytes": 1}}, "ranks"),
                        ({"ranks": [], "kept": []}, "kept")):
        r = post(True, data)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field and r.json()["message"].startswith("bad result of a launch order: ")
    r = post(False, {"corrupt": {"checkpoint": "../x"}})
    assert r.status_code == 422 and r.json()["field"] == "corrupt.checkpoint"
    with plane.db.read() as s:
        row = s.get(ActionRow, act["id"])
        assert row is not None and row.status == "sent" and row.result is None  # nothing applied
    assert plane.job(jid)["placement"][0]["pid"] is None
    r = post(True, {"ranks": [{"rank": 0, "pid": 4242}]})
    assert r.status_code == 200 and r.json()["applied"] is True
    with plane.db.read() as s:
        row = s.get(ActionRow, act["id"])
        assert row is not None and row.result == {"ok": True, "error": None, "ranks": [{"rank": 0, "pid": 4242}],
                                                  "replicated_bytes": None, "replicated_chunks": None,
                                                  "replicated_s": None}
    assert plane.job(jid)["placement"][0]["pid"] == 4242
    # A stale result is ignored before its data is looked at.
    assert post(True, {"nonsense": 1}).json() == {"applied": False}


def test_exit_reports_are_typed_rank_exits(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    assert plane.http.post("/v1/agent/register", headers=plane.as_agent(), json={
        "name": "node-1", "agent_id": "A", "devices": 2, "cpus": [[0], [1]]}).status_code == 200
    jid = plane.submit(ranks=2)
    plane.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 10}, {"rank": 1, "pid": 11}])
    with plane.db.tx() as s:
        # As the route passes them today (plain data), and as protocol messages.
        assert agents.exited(s, "node-1", "A", jid, 1, [{"rank": 0, "code": 0, "at": 5.0}], keep=3)
        assert agents.exited(s, "node-1", "A", jid, 1, [protocol.RankExit(rank=1, code=0, at=6.0)], keep=3)
        with pytest.raises(ValidationError) as e:
            agents.exited(s, "node-1", "A", jid, 1, [{"rank": 0, "code": "zero"}], keep=3)
        assert e.value.fields["field"] == "code"
        with pytest.raises(ValidationError) as e:
            agents.exited(s, "node-1", "A", jid, 1, [protocol.RankExit(rank=2, code=0)], keep=3)
        assert e.value.fields["field"] == "ranks"
    j = plane.job(jid)
    assert j["state"] == "succeeded"
    assert j["exited"] == {"0": {"code": 0, "signal": None, "at": 5.0, "stopped": False},
                           "1": {"code": 0, "signal": None, "at": 6.0, "stopped": False}}


def test_agent_bookkeeping_reads_the_databases_clock(plane: Plane) -> None:
    # Ahead of the machine's clock (what the rest of the control plane still reads): leases never expire here.
    t0 = float(int(time.time()) + 1_000_000)
    fixed = FixedClock(t0)
    plane.db.info["clock"] = fixed
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    with plane.db.read() as s:
        node = s.get(NodeRow, "node-1")
        assert node is not None and (node.registered_at, node.lease_until) == (t0, t0 + 30)
    fixed.t += 10
    assert plane.http.post("/v1/agent/node-1/heartbeat", headers=plane.as_agent(),
                           json={"agent_id": "A"}).status_code == 200
    jid = plane.submit()
    fixed.t += 5
    start(plane, a, jid)
    with plane.db.read() as s:
        node = s.get(NodeRow, "node-1")
        assert node is not None and node.lease_until == t0 + 40
        (row,) = s.scalars(select(ActionRow).where(ActionRow.job_id == jid))
        assert row.done_at == t0 + 15


def test_an_unknown_field_in_an_agent_body_is_a_422_naming_it(plane: Plane) -> None:
    bodies: dict[str, dict[str, Any]] = {
        "/v1/agent/register": {"name": "node-1", "agent_id": "A", "devices": 1, "cpus": [[0]]},
        "/v1/agent/node-1/heartbeat": {"agent_id": "A"},
        "/v1/agent/node-1/exits": {"agent_id": "A", "job_id": "j1", "attempt": 1, "ranks": []},
    }
    for path, body in bodies.items():
        for key, field in (("colour", "colour"), ("\ud800", "\\ud800")):
            r = raw(plane, "POST", path, {**body, key: None}, plane.as_agent())
            assert r.status_code == 422 and r.json()["field"] == field, (path, r.text)


def test_a_cluster_lies_in_one_region(plane: Plane) -> None:
    """A node joining a cluster name already in another region is refused: the scheduler's topology could not
    hold it (every pass would fail), so the node learns why at registration and the cluster goes on."""
    def register(name: str, region: str, cluster: str) -> httpx.Response:
        return plane.http.post("/v1/agent/register", headers=plane.as_agent(), json={
            "name": name, "agent_id": f"A-{name}", "devices": 1, "cpus": [[0]], "region": region,
            "cluster": cluster})

    assert register("w1", "west", "local").status_code == 200
    r = register("e1", "east", "local")
    assert r.status_code == 409
    assert r.json()["message"] == "cluster local is in region west: node e1 cannot join it in region east"
    assert register("e1", "east", "east-1").status_code == 200
    assert register("w1", "west", "local").status_code == 200  # the same node again: no conflict with itself
    jid = plane.submit()
    plane.rec.once()
    assert plane.job(jid)["state"] == "running"  # the scheduler's passes still work
