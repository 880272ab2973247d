"""A user's device cap on the real control plane: the reconcile loop reads the caps in each pass's transaction
(``Reconciler(device_caps=...)``) and hands them to the live policy, which starts an elastic job shrunk to
what is left under the cap, grows nothing past it, and keeps the next job waiting with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

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
