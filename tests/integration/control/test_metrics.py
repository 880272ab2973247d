"""GET /metrics against the in-process control plane, driven by scripted agents: a job preempted, resumed,
migrated, through a failed checkpoint, to its end; each counter and histogram says so once, whether the events
are folded in one batch or one at a time, scraped once or many times, by this app or another one over the same
database (a restarted control plane). Who may scrape, and the gauges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tidal.control import tally, tokens
from tidal.control.api.app import Context, create_app
from tidal.testing.control import FakeAgent, Plane, checkpoint_result

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(p: Plane, token: str | None, client: TestClient | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = (client or p.http).get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    out: Samples = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def metrics_token(p: Plane) -> str:
    with p.db.tx() as s:
        return tokens.create_user(s, "prometheus", "metrics")


def post(p: Plane, path: str, **kw: Any) -> Any:
    r = p.http.post(path, headers=p.as_user(), **kw)
    assert r.status_code == 200, r.text
    return r.json()


def order(a: FakeAgent, kind: str) -> dict[str, Any]:
    """The one action of ``kind`` handed to ``a`` now (side orders, such as prestaging a migration's target,
    are left unanswered: the control plane does not wait on them)."""
    (act,) = [x for x in a.actions() if x["kind"] == kind]
    return act


def story(p: Plane) -> str:
    """A job on node-1: preempted by its user, resumed there, a checkpoint that fails, migrated to node-2, ended
    with code 0. Its id."""
    a1, a2 = FakeAgent(p, "node-1", "A1"), FakeAgent(p, "node-2", "A2")
    assert a1.register() == 200
    jid = p.submit(tier="standard")
    p.rec.once()
    (act,) = a1.actions()
    assert a1.result(act, ranks=[{"rank": 0, "pid": 1}])
    post(p, f"/v1/jobs/{jid}/preempt")
    (act,) = a1.actions()
    assert a1.result(act, **checkpoint_result(act["payload"]["checkpoint_id"], size=3 << 20, stored=1 << 20))
    post(p, f"/v1/jobs/{jid}/resume")
    p.rec.once()
    (act,) = a1.actions()
    assert act["kind"] == "restore"
    assert a1.result(act, ranks=[{"rank": 0, "pid": 2}])
    post(p, f"/v1/jobs/{jid}/preempt")
    (act,) = a1.actions()
    assert a1.result(act, ok=False)  # the checkpoint failed: the job goes on
    assert p.job(jid)["state"] == "running"
    assert a2.register() == 200
    post(p, f"/v1/jobs/{jid}/migrate", json={"to": "node-2"})
    act = order(a1, "checkpoint")
    assert a1.result(act, **checkpoint_result(act["payload"]["checkpoint_id"], size=5 << 20, stored=2 << 20))
    act = order(a2, "restore")
    assert a2.result(act, ranks=[{"rank": 0, "pid": 3}])
    job = p.job(jid)
    assert job["state"] == "running" and job["placement"][0]["node"] == "node-2"
    hb = p.http.post("/v1/agent/node-2/heartbeat", headers=p.as_agent(), json={
        "agent_id": "A2", "jobs": {jid: {"attempt": job["attempt"], "cpu_s": 7.5, "rss_bytes": 1 << 30,
                                         "gpu_rank_bytes": 3 << 30, "steps": 40, "steps_per_s": 2.5}}})
    assert hb.status_code == 200, hb.text
    return jid


def check_story(m: Samples, jid: str) -> None:
    tier = {"tier": "standard"}
    assert value(m, "tidal_jobs_submitted_total", **tier) == 1
    assert value(m, "tidal_preemptions_total", **tier, cause="user") == 1
    assert value(m, "tidal_preemptions_total") == 1
    assert value(m, "tidal_migrations_total", **tier, cause="user") == 1
    assert value(m, "tidal_migrations_total") == 1
    assert value(m, "tidal_resizes_total") == 0
    assert value(m, "tidal_restarts_total") == 0
    assert value(m, "tidal_checkpoints_total", **tier, purpose="hold") == 1
    assert value(m, "tidal_checkpoints_total", **tier, purpose="migrate") == 1
    assert value(m, "tidal_checkpoint_failures_total", **tier, purpose="hold", cause="error") == 1
    assert value(m, "tidal_checkpoint_failures_total") == 1
    assert value(m, "tidal_checkpoint_size_bytes_count", **tier) == 2
    assert value(m, "tidal_checkpoint_size_bytes_sum", **tier) == 8 << 20
    assert value(m, "tidal_checkpoint_stored_bytes_sum", **tier) == 3 << 20
    assert value(m, "tidal_checkpoint_size_bytes_bucket", **tier, le="4194304.0") == 1  # 3 MiB; 5 MiB is over
    assert value(m, "tidal_checkpoint_pause_seconds_count", **tier) == 2
    assert value(m, "tidal_job_queueing_seconds_count", **tier) == 1
    assert value(m, "tidal_restore_seconds_count", **tier) == 2  # the resume's and the migration's
    assert value(m, "tidal_migration_seconds_count", **tier) == 1


def test_a_story_is_counted_once_by_every_scrape_and_every_process(plane: Plane, tmp_path: Path) -> None:
    token = metrics_token(plane)
    jid = story(plane)
    m = scrape(plane, token)
    check_story(m, jid)
    assert value(m, "tidal_jobs", state="running", tier="standard") == 1
    assert value(m, "tidal_jobs", state="pending") == 0
    assert value(m, "tidal_devices") == 2
    assert value(m, "tidal_devices_used", tier="standard") == 1
    assert value(m, "tidal_devices_idle") == 1
    assert value(m, "tidal_node_devices_used", node="node-2", tier="standard") == 1
    assert value(m, "tidal_node_up", node="node-1") == 1
    assert value(m, "tidal_job_cpu_seconds_total", node="node-2", job_id=jid) == 7.5
    assert value(m, "tidal_job_memory_rss_bytes", node="node-2", job_id=jid) == 1 << 30
    assert value(m, "tidal_job_steps_per_second", node="node-2", job_id=jid) == 2.5
    assert value(m, "tidal_job_gpu_rank_memory_bytes", node="node-2", job_id=jid) == 3 << 30
    assert value(m, "tidal_node_memory_rss_bytes", node="node-2") == 1 << 30
    assert value(m, "tidal_lease_renewals_total", node="node-2") == 1
    assert value(m, "tidal_sla_jobs", tier="standard") == 1
    assert 0 <= value(m, "tidal_sla_attainment", tier="standard") <= 1
    assert value(m, "tidal_sla_target", tier="premium") > 0
    assert value(m, "tidal_events_unfolded") == 0
    # Again, and from another app over the same database (a restarted control plane): nothing counted twice.
    check_story(scrape(plane, token), jid)
    other = TestClient(create_app(Context(db=plane.db, home=tmp_path)))
    check_story(scrape(plane, token, other), jid)


def test_folding_one_event_at_a_time_counts_as_folding_them_all(plane: Plane) -> None:
    jid = story(plane)
    with plane.db.tx() as s:
        while tally.fold(s, limit=1):
            pass
    check_story(scrape(plane, metrics_token(plane)), jid)


def test_the_end_of_a_job_and_a_lost_node(plane: Plane) -> None:
    token = metrics_token(plane)
    jid = story(plane)
    a2 = FakeAgent(plane, "node-2", "A2")
    assert a2.exit(jid, plane.job(jid)["attempt"], code=0)
    m = scrape(plane, token)
    assert value(m, "tidal_jobs_finished_total", tier="standard", state="succeeded") == 1
    assert value(m, "tidal_jobs") == 0
    assert value(m, "tidal_devices_idle") == 2
    assert value(m, "tidal_sla_jobs", tier="standard") == 1  # ended within the window
    # node-1's agent leaves: its lease is given up.
    r = plane.http.post("/v1/agent/node-1/leave", headers=plane.as_agent(), json={"agent_id": "A1"})
    assert r.status_code == 200, r.text
    m = scrape(plane, token)
    assert value(m, "tidal_lease_losses_total", cause="agent_left") == 1
    assert value(m, "tidal_node_up", node="node-1") == 0
    assert value(m, "tidal_devices") == 1


def test_a_restart_is_counted_with_its_cause(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A1")
    a.register()
    jid = plane.submit(max_restarts=2)
    plane.rec.once()
    (act,) = a.actions()
    a.result(act, ranks=[{"rank": 0, "pid": 1}])
    assert a.exit(jid, plane.job(jid)["attempt"], code=None, signal=9)  # killed from outside Tidal
    assert plane.job(jid)["restarts"] == 1
    m = scrape(plane, metrics_token(plane))
    assert value(m, "tidal_restarts_total", tier="basic", cause="killed") == 1


def test_who_may_scrape(plane: Plane, tmp_path: Path) -> None:
    assert plane.http.get("/metrics").status_code == 401
    assert plane.http.get("/metrics", headers=plane.as_user()).status_code == 403  # names others' jobs
    assert plane.http.get("/metrics", headers=plane.as_agent()).status_code == 403
    scrape(plane, metrics_token(plane))
    with plane.db.tx() as s:
        admin = tokens.create_user(s, "root", "admin")
    scrape(plane, admin)
    public = TestClient(create_app(Context(db=plane.db, home=tmp_path, metrics_public=True)))
    assert public.get("/metrics").status_code == 200


def test_request_latency_is_by_route_template(plane: Plane) -> None:
    jid = plane.submit()
    for _ in range(3):
        plane.job(jid)
    plane.http.get("/v1/no/such/route", headers=plane.as_user())
    m = scrape(plane, metrics_token(plane))
    assert value(m, "tidal_http_request_duration_seconds_count", method="GET", route="/v1/jobs/{job_id}",
                 status="200") == 3
    assert value(m, "tidal_http_request_duration_seconds_count", route="<unmatched>", status="404") == 1
    assert not any(jid in dict(lab).get("route", "") for _, lab in m)


def test_a_requeue_that_spends_no_restart_and_a_drain_are_counted(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A1")
    a.register()
    jid = plane.submit()
    plane.rec.once()
    (act,) = a.actions()
    a.result(act, ranks=[{"rank": 0, "pid": 1}])
    r = plane.http.post("/v1/agent/node-1/leave", headers=plane.as_agent(), json={"agent_id": "A1"})
    assert r.status_code == 200, r.text
    assert plane.job(jid)["restarts"] == 0
    with plane.db.tx() as s:
        admin = tokens.create_user(s, "root", "admin")
    r = plane.http.post("/v1/nodes/node-1/drain", headers={"Authorization": f"Bearer {admin}"}, json={})
    assert r.status_code == 200, r.text
    m = scrape(plane, metrics_token(plane))
    assert value(m, "tidal_requeues_total", tier="basic", cause="node_lost") == 1
    assert value(m, "tidal_restarts_total") == 0
    assert value(m, "tidal_node_drains_total", cause="admin") == 1
    assert value(m, "tidal_node_drained", node="node-1") == 1


@pytest.mark.parametrize("detail, cause", [
    ("node node-1 lost (lease expired); requeued from scratch, not counted as a restart (0/3 used)", "node_lost"),
    ("checkpoint c2 is damaged; requeued from checkpoint c1, not counted as a restart (0/3 used)", "checkpoint_bad"),
    ("checkpoint c2 is in a store that cannot be reached; requeued from checkpoint c1, not counted as a restart "
     "(1/3 used)", "store_unreachable"),
    ("its ranks were stopped; requeued from scratch, not counted as a restart (0/3 used)", "other"),
])
def test_requeue_causes(detail: str, cause: str) -> None:
    assert tally._REQUEUE.search(detail) and not tally._RESTART.search(detail)
    assert tally._requeue_cause(detail) == cause


@pytest.mark.parametrize("detail, cause", [
    # (Node losses counted as restarts before they no longer did: such events may still be folded.)
    ("node node-1 lost (lease expired); restart 1/3, from scratch", "node_lost"),
    ("restore failed (boom); restart 2/3, from checkpoint c", "restore_failed"),
    ("rank 0 killed by signal 9 from outside Tidal; restart 1/3, from scratch", "killed"),
    ("its ranks were stopped; restart 1/3, from scratch", "other"),
])
def test_restart_causes(detail: str, cause: str) -> None:
    assert tally._restart_cause(detail) == cause
