"""Why a job waits, on the real control plane (the live policy, a scripted agent): the reason is stored with the
job and shown by the API, recorded as an event once when it changes, and cleared when the job runs."""

from __future__ import annotations

from pathlib import Path

from tidal.control.reconcile import Reconciler
from tidal.policy.registry import make_live_policy
from tidal.testing import FakeClock
from tidal.testing.control import FakeAgent, Plane

ELASTIC = "needs 2 free device(s) (an elastic job starts on at least 50% of its 4), 1 free"


def _run(p: Plane, agent: FakeAgent) -> dict[str, object]:
    (act,) = agent.actions()
    assert act["kind"] == "launch"
    assert agent.result(act, ranks=[{"rank": r["rank"], "pid": 100 + r["rank"]} for r in act["payload"]["ranks"]])
    return act


def test_an_elastic_job_that_cannot_fit_pends_with_its_reason_until_it_runs(tmp_path: Path) -> None:
    p = Plane(tmp_path)
    p.rec = Reconciler(p.db, make_live_policy())  # the live default
    a = FakeAgent(p, "node-1", "A", devices=4)
    assert a.register() == 200
    first = p.submit(name="first", ranks=3)
    p.rec.once()
    _run(p, a)
    elastic = p.submit(name="elastic", ranks=4, min_devices=1)
    p.rec.once()
    assert a.actions() == []
    j = p.job(elastic)
    assert j["state"] == "pending"
    assert (j["reason_code"], j["reason"]) == ("no_devices", ELASTIC)
    (listed,) = [x for x in p.http.get("/v1/jobs", headers=p.as_user()).json() if x["id"] == elastic]
    assert listed["reason"] == ELASTIC
    p.rec.once()
    p.rec.once()
    waiting = [e for e in p.job(elastic)["events"] if e["kind"] == "waiting"]
    assert [e["detail"] for e in waiting] == [ELASTIC]  # recorded once, not at every pass

    # The first job ends: the elastic one starts, and no longer has a reason.
    r = p.http.post("/v1/agent/node-1/exits", headers=p.as_agent(), json={
        "agent_id": a.id, "job_id": first, "attempt": 1,
        "ranks": [{"rank": r, "code": 0, "signal": None} for r in range(3)]})
    assert r.json()["applied"] and p.job(first)["state"] == "succeeded"
    p.rec.once()
    _run(p, a)
    j = p.job(elastic)
    assert j["state"] == "running" and j["reason"] is None and j["reason_code"] is None
    assert p.job(first)["reason"] is None
    p.db.close()


def test_a_held_job_says_so_and_a_released_one_is_explained_again(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A", devices=1)
    assert a.register() == 200
    busy = plane.submit(name="busy")
    plane.rec.once()
    _run(plane, a)
    jid = plane.submit(name="later")
    assert plane.http.post(f"/v1/jobs/{jid}/preempt", headers=plane.as_user()).status_code == 200
    j = plane.job(jid)
    assert j["state"] == "held" and j["reason"] == "held by its owner: `tidal resume` releases it"
    plane.http.post(f"/v1/jobs/{jid}/resume", headers=plane.as_user())
    assert plane.job(jid)["reason"] is None
    plane.rec.once()  # nothing can start (no free device, only basic work waits): it is explained all the same
    j = plane.job(jid)
    assert (j["state"], j["reason_code"]) == ("pending", "no_devices")
    assert j["reason"] == "needs 1 free device(s), 0 free"
    assert plane.job(busy)["reason"] is None


def test_new_waiting_jobs_are_explained_at_most_once_a_second(tmp_path: Path) -> None:
    """A burst of submissions to a full cluster: the pass that only explains them (it reads every live job under
    the writers' lock) runs at most every ``explain_every`` seconds, not once per submission."""
    clock = FakeClock()
    p = Plane(tmp_path)
    p.db.info["clock"] = clock
    p.rec = Reconciler(p.db, make_live_policy(), explain_every=1.0, clock=clock)
    a = FakeAgent(p, "node-1", "A", devices=1)
    assert a.register() == 200
    busy = p.submit(name="busy")
    p.rec.once()  # places it, and explains whatever waits (nothing)
    _run(p, a)
    clock.advance(1.0)
    first = p.submit(name="first")
    p.rec.once()
    assert p.job(first)["reason_code"] == "no_devices"  # a second after the last explanation: at once
    second = p.submit(name="second")
    clock.advance(0.5)
    p.rec.once()
    assert p.job(second)["reason"] is None  # within the second: not yet
    clock.advance(0.6)
    p.rec.once()
    assert p.job(second)["reason_code"] == "no_devices"
    assert p.job(busy)["state"] == "running"
    p.db.close()
