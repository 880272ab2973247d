"""The control plane against a scripted fake agent (no CRIU): actions with ids handed out once, results
applied once, stale reports ignored, leases and fencing, and the job lifecycle they drive."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tidal.control.reconcile import Reconciler
from tidal.control.store.db import Database
from tidal.policy.admission import Quotas
from tidal.testing.control import FakeAgent, Plane, checkpoint_result, start


def ckpt(n: int) -> dict[str, Any]:
    return checkpoint_result(f"00000{n}-x")


def test_launch_run_and_finish_with_idempotent_results(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    assert a.register() == 200
    jid = plane.submit(name="j")
    plane.rec.once()
    (act,) = a.actions()
    assert act["kind"] == "launch" and act["payload"]["attempt"] == 1
    assert a.actions() == []  # handed out once
    assert a.result(act, ranks=[{"rank": 0, "pid": 4242}])
    assert not a.result(act, ranks=[{"rank": 0, "pid": 1}])  # a retried result: stale
    j = plane.job(jid)
    assert j["state"] == "running"
    assert j["placement"] == [{"rank": 0, "node": "node-1", "device": 0, "pid": 4242}]
    assert not a.exit(jid, attempt=7)  # another attempt's exit: stale
    assert a.exit(jid, attempt=1, code=0)
    j = plane.job(jid)
    assert j["state"] == "succeeded" and j["exit_code"] == 0
    assert [e["kind"] for e in j["events"]] == ["submitted", "running", "started", "stale_result_ignored",
                                                "ranks_exited", "ranks_exited", "succeeded"]


def test_preempt_hold_resume_and_migrate(plane: Plane) -> None:
    a, b = FakeAgent(plane, "node-1", "A"), FakeAgent(plane, "node-2", "B")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)
    b.register()
    assert plane.http.post(f"/v1/jobs/{jid}/preempt", headers=plane.as_user()).status_code == 200
    (act,) = a.actions()
    assert act["kind"] == "checkpoint" and act["payload"]["then"] == "kill"
    # busy: a second request is refused with a retryable conflict
    r = plane.http.post(f"/v1/jobs/{jid}/migrate", headers=plane.as_user(), json={})
    assert r.status_code == 409 and r.json()["busy"] is True
    assert a.result(act, **ckpt(1))
    j = plane.job(jid)
    assert j["state"] == "preempted" and j["held"] and j["placement"] == []
    plane.rec.once()
    assert a.actions() == [] and b.actions() == []  # held: not resumed
    plane.http.post(f"/v1/jobs/{jid}/resume", headers=plane.as_user())
    plane.rec.once()
    acts = a.actions() + b.actions()
    assert [x["kind"] for x in acts] == ["restore"] and acts[0]["payload"]["attempt"] == 2
    agent = a if plane.job(jid)["placement"][0]["node"] == "node-1" else b
    assert agent.result(acts[0], ranks=[{"rank": 0, "pid": 5}])
    here = plane.job(jid)["placement"][0]["node"]
    other = b if here == "node-1" else a
    r = plane.http.post(f"/v1/jobs/{jid}/migrate", headers=plane.as_user(), json={"to": other.name})
    assert r.status_code == 200 and r.json()["to"] == other.name
    (act,) = agent.actions()
    # The target fetches the checkpoint the job was restored from meanwhile.
    (prestage,) = other.actions()
    first = plane.job(jid)["checkpoints"][0]["id"]
    assert prestage["kind"] == "prestage" and prestage["payload"]["checkpoint"]["id"] == first
    assert agent.result(act, **ckpt(2))
    (restore,) = other.actions()
    assert restore["kind"] == "restore" and restore["payload"]["attempt"] == 3
    assert other.result(restore, ranks=[{"rank": 0, "pid": 6}])
    j = plane.job(jid)
    assert j["state"] == "running" and j["placement"][0]["node"] == other.name
    assert len(j["checkpoints"]) == 2
    kinds = [e["kind"] for e in j["events"]]
    assert kinds.count("checkpointing") == 2 and "migrating" in kinds and "held" not in kinds


def test_checkpoint_failure_keeps_the_job_running(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)
    plane.http.post(f"/v1/jobs/{jid}/preempt", headers=plane.as_user())
    (act,) = a.actions()
    assert a.result(act, ok=False)
    j = plane.job(jid)
    assert j["state"] == "running" and not j["held"] and j["placement"][0]["pid"] == 4242


def test_lease_expiry_requeues_and_fences(tmp_path: Path) -> None:
    p = Plane(tmp_path, lease_s=1.0)
    a = FakeAgent(p, "node-1", "A")
    a.register()
    jid = p.submit()
    start(p, a, jid)
    p.http.post("/v1/agent/node-1/heartbeat", headers=p.as_agent(), json={"agent_id": "A"})
    assert FakeAgent(p, "node-1", "A2").register() == 409  # the lease is A's until it expires
    time.sleep(1.1)
    p.rec.once()
    j = p.job(jid)
    # Requeued without spending a restart: a lost node is none of the job's failures.
    assert j["state"] == "pending" and j["restarts"] == 0 and j["placement"] == []
    # the old agent is told it lost the node: its reports are refused, it must fence its ranks
    r = p.http.post("/v1/agent/node-1/heartbeat", headers=p.as_agent(), json={"agent_id": "A"})
    assert r.status_code == 409 and r.json()["error"] == "LeaseLost"
    assert p.http.post("/v1/agent/node-1/exits", headers=p.as_agent(), json={
        "agent_id": "A", "job_id": jid, "attempt": 1, "ranks": [{"rank": 0, "code": 0}]}).status_code == 409
    a2 = FakeAgent(p, "node-1", "A2")
    assert a2.register() == 200
    p.rec.once()
    (act,) = a2.actions()
    assert act["kind"] == "launch" and act["payload"]["attempt"] == 2  # no checkpoint: from scratch
    p.db.close()


def test_signal_from_outside_restores_up_to_max_restarts(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit(max_restarts=1, checkpoint_every=3600)
    start(plane, a, jid)
    assert a.exit(jid, attempt=1, code=None, signal=9)
    plane.rec.once()
    (act,) = a.actions()
    assert act["kind"] == "launch"
    a.result(act, ranks=[{"rank": 0, "pid": 7}])
    assert a.exit(jid, attempt=2, code=None, signal=9)
    j = plane.job(jid)
    assert j["state"] == "failed" and "no restarts left" in j["events"][-1]["detail"]


def test_nonzero_exit_fails_without_retry(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)
    assert a.exit(jid, attempt=1, code=3)
    j = plane.job(jid)
    assert j["state"] == "failed" and j["exit_code"] == 3 and j["restarts"] == 0
    r = plane.http.post(f"/v1/jobs/{jid}/cancel", headers=plane.as_user())
    assert r.status_code == 409


def test_logs_follow_the_current_attempt(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)

    def put(attempt: int, offset: int, data: bytes) -> bool:
        r = plane.http.put(f"/v1/agent/node-1/logs/{jid}/0", headers=plane.as_agent(), content=data,
                           params={"agent_id": "A", "attempt": attempt, "offset": offset})
        return bool(r.json()["applied"])

    assert put(1, 0, b"one\ntwo\n") and put(1, 8, b"three\n")
    assert not put(0, 0, b"stale\n")
    assert put(1, 4, b"TWO\n")  # an attempt's log starts again from a checkpoint's copy: cut there
    r = plane.http.get(f"/v1/jobs/{jid}/logs", headers=plane.as_user())
    assert r.content == b"one\nTWO\n" and r.headers["X-Tidal-Log-Size"] == "8"
    r = plane.http.get(f"/v1/jobs/{jid}/logs", headers=plane.as_user(), params={"offset": 4})
    assert r.content == b"TWO\n"


def test_periodic_checkpoints_are_dispatched(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit(checkpoint_every=0.01)
    start(plane, a, jid)
    time.sleep(0.02)
    plane.rec.once()
    (act,) = a.actions()
    assert act["kind"] == "checkpoint" and act["payload"]["then"] == "continue"
    assert a.result(act, **ckpt(1))
    j = plane.job(jid)
    assert j["state"] == "running" and len(j["checkpoints"]) == 1 and j["placement"][0]["pid"] == 4242


def test_losing_a_migration_destination_requeues_instead(tmp_path: Path) -> None:
    p = Plane(tmp_path, lease_s=1.0)
    a, b = FakeAgent(p, "node-1", "A"), FakeAgent(p, "node-2", "B")
    a.register()
    jid = p.submit()
    start(p, a, jid)
    b.register()
    assert p.http.post(f"/v1/jobs/{jid}/migrate", headers=p.as_user(), json={"to": "node-2"}).status_code == 200
    (act,) = a.actions()
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:  # node-1 stays alive, node-2 goes silent
        p.http.post("/v1/agent/node-1/heartbeat", headers=p.as_agent(), json={"agent_id": "A"})
        time.sleep(0.05)
    p.http.post("/v1/agent/node-1/heartbeat", headers=p.as_agent(), json={"agent_id": "A"})
    p.rec.once()
    j = p.job(jid)
    assert j["state"] == "checkpointing" and j["restarts"] == 0  # its ranks still run on node-1
    assert a.result(act, **ckpt(1))
    j = p.job(jid)
    assert j["state"] == "preempted" and not j["held"]
    p.rec.once()
    (restore,) = a.actions()
    assert restore["kind"] == "restore"
    p.db.close()


@pytest.mark.parametrize("policy", ["firstfit", "singularity"])
def test_premium_preempts_basic_under_either_policy(tmp_path: Path, policy: str) -> None:
    from tidal.policy.registry import make_live_policy

    p = Plane(tmp_path)
    p.rec = Reconciler(p.db, make_live_policy(policy))
    a = FakeAgent(p, "node-1", "A")
    a.register()
    basic = p.submit(tier="basic")
    start(p, a, basic)
    p.db.sessions  # noqa: B018
    with p.db.tx() as s:  # it has run long enough to be preemptible under any minimum run time
        from tidal.control.store.models import JobRow

        s.get(JobRow, basic).started_at = time.time() - 3600  # type: ignore[union-attr]
    premium = p.submit(tier="premium")
    p.rec.once()
    (act,) = a.actions()
    assert act["kind"] == "checkpoint" and act["job_id"] == basic and act["payload"]["then"] == "kill"
    assert a.result(act, **ckpt(1))
    assert p.job(basic)["state"] == "preempted" and not p.job(basic)["held"]
    p.rec.once()
    (launch,) = a.actions()
    assert launch["job_id"] == premium and launch["kind"] == "launch"
    a.result(launch, ranks=[{"rank": 0, "pid": 9}])
    assert a.exit(premium, attempt=1, code=0)
    p.rec.once()
    (again,) = a.actions()
    assert again["job_id"] == basic and again["kind"] == "restore"
    p.db.close()


def test_heartbeats_carry_progress_of_the_current_attempt(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)

    def beat(attempt: int, cpu: float) -> None:
        r = plane.http.post("/v1/agent/node-1/heartbeat", headers=plane.as_agent(), json={
            "agent_id": "A", "jobs": {jid: {"attempt": attempt, "cpu_s": cpu, "rss_bytes": 1, "output_bytes": 2}}})
        assert r.status_code == 200

    beat(1, 1.5)
    assert plane.job(jid)["progress"]["cpu_s"] == 1.5
    beat(0, 9.0)  # an older attempt's figures are not the job's
    assert plane.job(jid)["progress"]["cpu_s"] == 1.5


def test_migrations_upgrade_an_existing_database(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import inspect

    from tidal.control.store.db import MIGRATIONS

    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    assert "progress" not in {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    db.migrate()
    assert "progress" in {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    db.close()


def test_guaranteed_jobs_over_their_projects_quota_are_admitted_as_basic(tmp_path: Path) -> None:
    p = Plane(tmp_path, quotas=Quotas({"vision": 0.5}))
    p.add_projects("vision", "speech")
    for name in ("node-1", "node-2", "node-3", "node-4"):
        assert FakeAgent(p, name, name).register() == 200  # 4 devices: vision may hold 2 guaranteed
    first = p.submit_reply(tier="standard", ranks=2, project="vision")
    assert first["tier"] == "standard" and "admitted_as" not in first
    second = p.submit_reply(tier="premium", ranks=1, project="vision")
    assert second["tier"] == "basic" and second["admitted_as"] == "basic"
    assert second["admission"] == ("project 'vision' has 2 of its 2 guaranteed devices admitted; "
                                   "1 more would exceed its quota")
    assert p.job(second["id"])["tier"] == "basic"
    events = p.http.get("/v1/events", headers=p.as_user(), params={"job": second["id"]}).json()
    assert events[0]["detail"] == ("premium job 'train' of 1 rank(s) by alice; admitted as basic: "
                                   + second["admission"])
    assert p.submit_reply(tier="premium", project="speech")["tier"] == "premium"  # no quota: not limited
    assert p.http.post(f"/v1/jobs/{first['id']}/cancel", headers=p.as_user()).status_code == 200
    assert p.submit_reply(tier="premium", ranks=2, project="vision")["tier"] == "premium"  # room again
    p.db.close()


def test_agents_retire_only_checkpoints_no_longer_listed(plane: Plane) -> None:
    """A checkpoint action tells the agent which stored checkpoints to keep when it applies retention:
    every one the API lists, not only the newest keep - 1. The one being written may never be committed
    (here: it fails), and until it is the oldest listed checkpoint must still be in the store."""
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit(checkpoint_every=0.01)
    start(plane, a, jid)
    committed = []
    for n in range(1, 7):
        time.sleep(0.02)
        plane.rec.once()
        (act,) = a.actions()
        listed = plane.job(jid)["checkpoints"]
        new = act["payload"]["checkpoint_id"]
        assert act["payload"]["keep_ids"] == [p for c in listed for p in c["parts"]] + [new]
        ok = n != 4
        data = checkpoint_result(new)
        assert a.result(act, ok=ok, **(data if ok else {}))
        committed += [new] if ok else []
        assert [c["id"] for c in plane.job(jid)["checkpoints"]] == committed[-3:]
    assert len(committed) == 5
