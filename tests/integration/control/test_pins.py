"""A job pinned to D devices by `tidal resize` stays pinned to the devices it runs on across migrations: a
whole-job migration keeps it on D devices, and moving one rank of ranks that share a device re-pins it to the
devices it then runs on (rather than leaving a pin the job no longer keeps, which the next restore would
silently undo)."""

from __future__ import annotations

from typing import Any

from tidal.control.reconcile import snapshot
from tidal.testing.control import FakeAgent, Plane, checkpoint_result


def _started(agent: FakeAgent, pid: int = 100) -> None:
    # (A migration's target is also sent a prestage: a side order, left unanswered here.)
    (act,) = [a for a in agent.actions() if a["kind"] != "prestage"]
    assert act["kind"] in ("launch", "restore"), act
    assert agent.result(act, ranks=[{"rank": r["rank"], "pid": pid + r["rank"]} for r in act["payload"]["ranks"]])


def _checkpointed(agent: FakeAgent, ck: str) -> None:
    (act,) = agent.actions()
    assert act["kind"] == "checkpoint", act
    assert agent.result(act, **checkpoint_result(ck))


def _on(job: dict[str, Any]) -> dict[int, tuple[str, int]]:
    return {p["rank"]: (p["node"], p["device"]) for p in job["placement"]}


def _pinned_to_one_device(plane: Plane) -> tuple[str, FakeAgent, FakeAgent]:
    """A job of 2 ranks on node-1, resized by its owner to 1 device (both ranks on it)."""
    a, b = FakeAgent(plane, "node-1", "A", devices=2), FakeAgent(plane, "node-2", "B", devices=2)
    assert a.register() == 200
    jid = plane.submit(ranks=2, min_devices=1)
    plane.rec.once()
    _started(a)
    assert b.register() == 200
    r = plane.http.post(f"/v1/jobs/{jid}/resize", headers=plane.as_user(), json={"devices": 1})
    assert r.status_code == 200 and r.json()["pinned"], r.text
    _checkpointed(a, "000001-a")
    _started(a, 200)
    j = plane.job(jid)
    assert j["state"] == "running" and j["devices"] == 1 and j["pinned_devices"] == 1
    return jid, a, b


def test_a_whole_job_migration_keeps_the_pinned_number_of_devices(plane: Plane) -> None:
    jid, a, b = _pinned_to_one_device(plane)
    r = plane.http.post(f"/v1/jobs/{jid}/migrate", headers=plane.as_user(), json={"to": "node-2"})
    assert r.status_code == 200, r.text
    _checkpointed(a, "000002-b")
    _started(b, 300)
    j = plane.job(jid)
    assert j["state"] == "running" and {n for n, _ in _on(j).values()} == {"node-2"}
    assert j["devices"] == 1 and j["pinned_devices"] == 1
    assert _on(j)[0] == _on(j)[1]  # both ranks still share one device


def test_moving_one_rank_re_pins_the_job_to_the_devices_it_runs_on(plane: Plane) -> None:
    jid, a, b = _pinned_to_one_device(plane)
    r = plane.http.post(f"/v1/jobs/{jid}/migrate", headers=plane.as_user(), json={"to": "node-2", "rank": 1})
    assert r.status_code == 200, r.text
    _checkpointed(a, "000002-b")
    _started(a, 300)
    _started(b, 300)
    j = plane.job(jid)
    assert j["state"] == "running" and _on(j)[1][0] == "node-2" and _on(j)[0][0] == "node-1"
    assert j["devices"] == 2 and j["pinned_devices"] == 2
    assert any(e["kind"] == "resize_pinned" and "2 device(s)" in e["detail"] for e in j["events"]), j["events"]
    # The scheduler keeps it on the devices it runs on: its next restore is on 2 devices too.
    with plane.db.read() as s:
        view, _ = snapshot(s)
    assert (view.jobs[jid].min_devices, view.jobs[jid].max_devices) == (2, 2)
