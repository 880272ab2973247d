"""A user's and a project's device caps on the real control plane: the reconcile loop reads the caps in each
pass's transaction (``Reconciler(device_caps=..., project_caps=...)``) and hands them to the live policy, which
starts an elastic job shrunk to what is left under the cap, grows nothing past it, and keeps the next job waiting
with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from tidal.control import tokens, userlimits
from tidal.control.reconcile import Reconciler, snapshot
from tidal.policy.registry import make_live_policy
from tidal.testing.control import FakeAgent, Plane


def _started(agent: FakeAgent) -> dict[str, Any]:
    (act,) = agent.actions()
    assert act["kind"] == "launch"
    assert agent.result(act, ranks=[{"rank": r["rank"], "pid": 100 + r["rank"]} for r in act["payload"]["ranks"]])
    return act


def test_the_loop_keeps_each_users_device_cap(plane: Plane) -> None:
    asked: list[Session] = []

    def caps(s: Session) -> Mapping[str, int]:
        asked.append(s)
        return {"alice": 4}

    plane.rec = Reconciler(plane.db, make_live_policy(), device_caps=caps)
    agent = FakeAgent(plane, "node-1", "A", devices=8)
    assert agent.register() == 200
    first = plane.submit(name="first", ranks=3)
    plane.rec.once()
    _started(agent)
    # One device is left under alice's cap of 4: the 4-rank elastic job starts on it (its ranks spliced), and
    # does not grow into the 4 idle devices while the first runs.
    elastic = plane.submit(name="elastic", ranks=4, min_devices=1)
    plane.rec.once()
    act = _started(agent)
    assert {r["device"] for r in act["payload"]["ranks"]} == {3} and len(act["payload"]["ranks"]) == 4
    third = plane.submit(name="third", ranks=1)
    plane.rec.once()
    plane.rec.once()
    assert agent.actions() == []
    j = plane.job(third)
    assert (j["state"], j["reason_code"], j["reason"]) == (
        "pending", "device_cap", "user alice holds 4 of at most 4 devices (it needs 1)")
    assert asked  # read in the pass's own transaction
    with plane.db.read() as s:
        view, _ = snapshot(s, device_caps={"alice": 4})
    assert view.device_caps == {"alice": 4}
    assert {v.owner for v in view.jobs.values()} == {"alice"} and {first, elastic, third} <= set(view.jobs)


def test_no_caps_by_default(plane: Plane) -> None:
    plane.rec = Reconciler(plane.db, make_live_policy())
    with plane.db.read() as s:
        view, _ = snapshot(s)
    assert view.device_caps == {}


def test_the_loop_keeps_each_projects_device_cap(plane: Plane) -> None:
    # An admin caps project vision at 3 devices through the API; the loop reads the caps as the server has it.
    with plane.db.tx() as s:
        admin = {"Authorization": f"Bearer {tokens.create_user(s, 'root', 'admin')}"}
    plane.add_projects("vision", "nlp")
    r = plane.http.patch("/v1/projects/vision/limits", headers=admin, json={"max_devices": 3})
    assert r.status_code == 200 and r.json()["limits"]["max_devices"] == {"value": 3, "source": "project"}
    plane.rec = Reconciler(plane.db, make_live_policy(), device_caps=userlimits.device_caps,
                           project_caps=userlimits.project_device_caps)
    agent = FakeAgent(plane, "node-1", "A", devices=8)
    assert agent.register() == 200
    plane.submit(name="first", ranks=2, project="vision")
    plane.rec.once()
    _started(agent)
    # One device is left under vision's cap: the 4-rank elastic job starts on it, and grows no further.
    plane.submit(name="elastic", ranks=4, min_devices=1, project="vision")
    plane.rec.once()
    act = _started(agent)
    assert len({r["device"] for r in act["payload"]["ranks"]}) == 1 and len(act["payload"]["ranks"]) == 4
    # vision's next job waits with the reason; nlp's starts.
    third = plane.submit(name="third", ranks=1, project="vision")
    other = plane.submit(name="other", ranks=1, project="nlp")
    plane.rec.once()
    assert _started(agent)["job_id"] == other
    plane.rec.once()
    assert agent.actions() == []
    j = plane.job(third)
    assert (j["state"], j["reason_code"], j["reason"]) == (
        "pending", "project_cap", "project vision holds 3 of at most 3 devices (it needs 1)")
    # The cap raised: the next pass reads it, and the job starts.
    r = plane.http.patch("/v1/projects/vision/limits", headers=admin, json={"max_devices": 4})
    assert r.status_code == 200
    plane.rec.once()
    assert _started(agent)["job_id"] == third
    with plane.db.read() as s:
        view, _ = snapshot(s, project_caps=userlimits.project_device_caps(s))
    assert view.project_caps == {"vision": 4} and view.device_caps == {}
