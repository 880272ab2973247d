"""Admission against the load in the live API (TIDAL_ADMIT_SLA), the simulator's rule
(tidal.policy.sla_admission): a premium or standard job that gives its run time and whose SLA the load
cannot meet is demoted, with the reason, or refused with the estimate (nothing kept); without a run time, or
with admission off, a job is admitted as asked."""

from __future__ import annotations

from pathlib import Path

from tidal.testing.control import FakeAgent, Plane

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
