"""Admission against the load in the live API (TIDAL_ADMIT_SLA), the simulator's rule
(tidal.policy.sla_admission): a premium or standard job that gives its run time and whose SLA the load
cannot meet is demoted, with the reason, or refused with the estimate (nothing kept); without a run time, or
with admission off, a job is admitted as asked."""

from __future__ import annotations

from pathlib import Path

from tidal.control.reconcile import Reconciler, snapshot
from tidal.control.store.models import JobRow
from tidal.policy.admission import Quotas
from tidal.policy.registry import make_live_policy
from tidal.testing.clock import FakeClock
from tidal.testing.control import FakeAgent, Plane, checkpoint_result, start

HOUR = 3600.0


def plane(tmp_path: Path, mode: str) -> Plane:
    p = Plane(tmp_path, admit_sla=mode)  # type: ignore[arg-type]
    assert FakeAgent(p, "node-1", "A", devices=2).register() == 200
    return p


def test_a_job_the_load_would_keep_from_its_sla_is_demoted(tmp_path: Path) -> None:
    p = plane(tmp_path, "demote")
    first = p.submit_reply(tier="premium", ranks=2, runtime=HOUR)  # the cluster's 2 devices for an hour
    assert first.get("admitted_as") is None
    second = p.submit_reply(tier="premium", ranks=1, runtime=HOUR)
    # Behind 2 device-hours on 2 devices: it would wait an hour for an hour's work, attainment 0.50.
    assert second["admitted_as"] == "basic"
    assert second["admission"] == ("expected attainment 0.50 at premium under the current load, below its "
                                   "target 0.95")
    assert p.job(second["id"])["tier"] == "basic"
    # A job that gives no run time is admitted as asked; so is any job at basic.
    assert p.submit_reply(tier="standard", ranks=1).get("admitted_as") is None
    assert p.submit_reply(tier="basic", ranks=1, runtime=HOUR).get("admitted_as") is None


def test_refused_with_the_estimate_and_nothing_kept(tmp_path: Path) -> None:
    p = plane(tmp_path, "refuse")
    p.submit_reply(tier="standard", ranks=2, runtime=2 * HOUR)
    before = p.http.get("/v1/jobs", headers=p.as_user()).json()
    r = p.http.post("/v1/jobs", headers=p.as_user(), json={"command": ["train"], "workdir": str(p.workdir),
                                                           "tier": "standard", "ranks": 1, "runtime": HOUR})
    assert r.status_code == 409, r.text
    # Behind 4 device-hours on 2 devices: two hours' wait for an hour's work.
    assert r.json()["message"] == ("job not admitted: expected attainment 0.33 at standard under the current "
                                   "load, below its target 0.70; submit later or at a lower tier")
    assert p.http.get("/v1/jobs", headers=p.as_user()).json() == before


def test_off_admits_as_asked_and_a_bad_runtime_is_refused(tmp_path: Path) -> None:
    p = plane(tmp_path, "off")
    p.submit_reply(tier="premium", ranks=2, runtime=HOUR)
    assert p.submit_reply(tier="premium", ranks=2, runtime=HOUR).get("admitted_as") is None
    r = p.http.post("/v1/jobs", headers=p.as_user(), json={"command": ["train"], "workdir": str(p.workdir),
                                                           "runtime": -5})
    assert r.status_code == 422 and r.json()["message"].startswith("runtime must be > 0")


def test_deferred_until_the_job_ahead_finishes_then_released_and_placed(tmp_path: Path) -> None:
    p = plane(tmp_path, "defer")
    a = FakeAgent(p, "node-1", "A", devices=2)
    first = p.submit(tier="standard", ranks=2, runtime=HOUR)  # the cluster's 2 devices for an hour
    start(p, a, first)
    reply = p.submit_reply(tier="standard", ranks=1, runtime=HOUR)
    # Behind 2 device-hours on 2 devices: it would wait an hour for an hour's work, attainment 0.50.
    why = "expected attainment 0.50 at standard under the current load, below its target 0.70"
    assert reply["deferred"] == f"{why}; it starts when that is met"
    assert reply.get("admitted_as") is None and reply["tier"] == "standard" and reply["state"] == "held"
    second = reply["id"]
    job = p.job(second)
    assert (job["state"], job["tier"], job["reason_code"]) == ("held", "standard", "deferred")
    assert job["reason"] == f"deferred: {why}; it starts when that is met"
    # A later standard job is deferred behind it, whatever its own estimate: none overtakes.
    third = p.submit_reply(tier="standard", ranks=1, runtime=1000 * HOUR)
    assert third["deferred"].startswith("behind 1 earlier deferred standard job(s)")
    # Not placed while deferred (the free devices do not matter: its SLA does).
    p.rec.once()
    assert a.actions() == [] and p.job(second)["state"] == "held"
    # The blocking job finishes: the next pass releases the deferred ones, in order, and places the first.
    r = p.http.post("/v1/agent/node-1/exits", headers=p.as_agent(), json={
        "agent_id": "A", "job_id": first, "attempt": 1,
        "ranks": [{"rank": 0, "code": 0, "signal": None}, {"rank": 1, "code": 0, "signal": None}]})
    assert r.json()["applied"] and p.job(first)["state"] == "succeeded"
    p.rec.once()
    released = [e for e in p.job(second)["events"] if e["kind"] == "released"]
    assert [e["detail"] for e in released] == ["released: expected attainment now 1.00 ≥ 0.70"]
    assert [e["kind"] for e in p.job(third["id"])["events"]].count("released") == 1
    acts = a.actions()
    assert [(x["kind"], x["job_id"]) for x in acts] == [("launch", second), ("launch", third["id"])]
    assert p.job(second)["state"] == "running"


def test_a_deferred_job_is_not_resumed_by_hand(tmp_path: Path) -> None:
    p = plane(tmp_path, "defer")
    p.submit(tier="premium", ranks=2, runtime=HOUR)
    jid = p.submit_reply(tier="premium", ranks=1, runtime=HOUR)["id"]
    r = p.http.post(f"/v1/jobs/{jid}/resume", headers=p.as_user(), json={})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (f"job {jid} is deferred by admission against the load: it starts when its "
                                   "expected attainment meets its target")
    assert p.job(jid)["state"] == "held"


def test_the_backlog_is_the_run_time_left_and_a_run_folds_into_the_service(tmp_path: Path) -> None:
    p = plane(tmp_path, "refuse")
    clock = FakeClock()
    p.db.info["clock"] = clock
    p.rec = Reconciler(p.db, make_live_policy(), clock=clock)
    a = FakeAgent(p, "node-1", "A", devices=2)
    first = p.submit(tier="standard", ranks=2, runtime=HOUR)
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 10}, {"rank": 1, "pid": 11}])
    clock.advance(1800.0)  # half its run time is done; then it is preempted (by hand)
    assert p.http.post(f"/v1/jobs/{first}/preempt", headers=p.as_user(), json={}).status_code == 200
    p.rec.once()
    (ck,) = a.actions()
    assert ck["kind"] == "checkpoint"
    assert a.result(ck, **checkpoint_result(ck["payload"]["checkpoint_id"]))
    assert p.job(first)["state"] == "preempted"
    with p.db.read() as s:
        row = s.get(JobRow, first)
        assert row is not None and row.attained_device_s == 2 * 1800.0  # its two devices' run, folded in
    assert p.http.post(f"/v1/jobs/{first}/resume", headers=p.as_user(), json={}).status_code == 200
    with p.db.read() as s:  # waiting again: the scheduler sees its service and what is left of its run time
        (view, _) = snapshot(s)
    assert (view.jobs[first].attained_device_s, view.jobs[first].duration_hint,
            view.jobs[first].remaining_hint) == (3600.0, HOUR, 1800.0)
    clock.advance(200.0)
    # Left of it: 2 devices × 1,800 s, so a new hour of standard work waits 1,800 s on 2 devices: 0.67 (counting
    # its whole run time, as if it had not run, would give 0.33).
    r = p.http.post("/v1/jobs", headers=p.as_user(), json={"command": ["train"], "workdir": str(p.workdir),
                                                           "tier": "standard", "ranks": 1, "runtime": HOUR})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("job not admitted: expected attainment 0.67 at standard under the current "
                                   "load, below its target 0.70; submit later or at a lower tier")


def test_a_deferred_job_does_not_count_towards_its_projects_quota(tmp_path: Path) -> None:
    p = Plane(tmp_path, admit_sla="defer", quotas=Quotas({"vision": 0.5}))
    p.add_projects("vision", "other")
    assert FakeAgent(p, "node-1", "A", devices=4).register() == 200
    # vision's quota: 2 of the 4 devices at guaranteed tiers. The premium job fills the cluster for an hour.
    assert p.submit_reply(tier="premium", ranks=4, runtime=HOUR, project="other").get("admitted_as") is None
    held = p.submit_reply(tier="standard", ranks=2, runtime=HOUR, project="vision")
    assert held["state"] == "held" and held["deferred"].startswith("expected attainment 0.50 at standard")
    # The deferred job holds none of vision's quota: another standard job of 2 is within it (deferred behind
    # the first, not demoted to basic for being over quota).
    second = p.submit_reply(tier="standard", ranks=2, runtime=HOUR, project="vision")
    assert second.get("admitted_as") is None and second["tier"] == "standard"
    assert second["deferred"].startswith("behind 1 earlier deferred standard job(s)")
