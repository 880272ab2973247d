"""Checkpoint states in the control plane, against a scripted fake agent (no CRIU): a restore that finds its
checkpoint damaged marks it bad and falls back to an older one, retention counts only good checkpoints and
keeps bad ones, and ``resume --from`` picks a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.control.jobs import retired
from tidal.control.store.models import CheckpointRow, CheckpointState
from tidal.testing.control import FakeAgent, Plane, checkpoint_result


def committed(cid: str) -> dict[str, Any]:
    return checkpoint_result(cid)


def corrupt(cid: str) -> dict[str, Any]:
    """What an agent reports when a restore fails verification (see Executor._run)."""
    message = f"checkpoint j/{cid}: file 'fs/out.txt': chunk ab12 is corrupt (sha256 mismatch)"
    return {"corrupt": {"checkpoint": cid, "object": "fs/out.txt", "chunk": "ab12", "reason": "sha256 mismatch",
                        "message": message}}


def post(p: Plane, path: str, **kw: Any) -> Any:
    return p.http.post(path, headers=p.as_user(), **kw)


def stopped_with(p: Plane, a: FakeAgent, n: int) -> tuple[str, list[str]]:
    """A job preempted (held) after ``n`` checkpoints, each taken by a preempt and a resume."""
    jid = p.submit()
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 1}])
    ids = []
    for i in range(n):
        assert post(p, f"/v1/jobs/{jid}/preempt").status_code == 200
        (act,) = a.actions()
        ids.append(act["payload"]["checkpoint_id"])
        assert a.result(act, **committed(ids[-1]))
        if i < n - 1:
            assert post(p, f"/v1/jobs/{jid}/resume").status_code == 200
            p.rec.once()
            (act,) = a.actions()
            assert act["payload"]["checkpoint"]["id"] == ids[-1]
            assert a.result(act, ranks=[{"rank": 0, "pid": 2 + i}])
    assert p.job(jid)["state"] == "preempted"
    return jid, ids


def resumed(p: Plane, n: int) -> tuple[FakeAgent, str, list[str], dict[str, Any]]:
    """A job stopped after ``n`` checkpoints, then resumed: its agent, id, checkpoints and restore action."""
    a = FakeAgent(p, "node-1", "A")
    a.register()
    jid, ids = stopped_with(p, a, n)
    post(p, f"/v1/jobs/{jid}/resume")
    p.rec.once()
    (act,) = a.actions()
    return a, jid, ids, act


def states(p: Plane, jid: str) -> list[tuple[str, str]]:
    r = p.http.get(f"/v1/jobs/{jid}/checkpoints", headers=p.as_user())
    assert r.status_code == 200
    return [(c["id"], c["state"]) for c in r.json()]


def test_a_damaged_checkpoint_is_marked_bad_and_the_job_resumes_from_the_one_before(plane: Plane) -> None:
    a, jid, (c1, c2), act = resumed(plane, 2)
    assert act["kind"] == "restore" and act["payload"]["checkpoint"] == {"id": c2, "parts": [c2], "source": None}
    assert a.result(act, ok=False, **corrupt(c2))

    j = plane.job(jid)
    assert j["state"] == "pending" and j["restarts"] == 0 and j["resume_from"] == c1
    assert states(plane, jid) == [(c1, "committed"), (c2, "bad")]
    bad = [e for e in j["events"] if e["kind"] == "checkpoint_bad"]
    assert [e["detail"] for e in bad] == [
        f"checkpoint {c2} is damaged: checkpoint j/{c2}: file 'fs/out.txt': chunk ab12 is corrupt "
        f"(sha256 mismatch) (found on node-1); it is kept for inspection and not restored again; resuming from "
        f"checkpoint {c1}"]
    assert bad[0]["cause"] == act["id"]
    assert j["events"][-1]["detail"] == (f"checkpoint {c2} is damaged; requeued from checkpoint {c1}, not counted as a "
                                         "restart (0/3 used)")

    plane.rec.once()
    (act,) = a.actions()
    assert act["kind"] == "restore" and act["payload"]["checkpoint"] == {"id": c1, "parts": [c1], "source": None}
    assert a.result(act, ranks=[{"rank": 0, "pid": 9}])
    j = plane.job(jid)
    assert j["state"] == "running" and j["restarts"] == 0
    assert f"restoring from checkpoint {c1}" in [e for e in j["events"] if e["kind"] == "running"][-1]["detail"]

    # The next checkpoint is the job's newest again; the bad one stays in the store (the agent keeps it).
    post(plane, f"/v1/jobs/{jid}/preempt")
    (act,) = a.actions()
    c3 = act["payload"]["checkpoint_id"]
    assert act["payload"]["keep_ids"] == [c1, c2, c3]
    assert a.result(act, **committed(c3))
    j = plane.job(jid)
    assert j["resume_from"] is None
    assert states(plane, jid) == [(c1, "committed"), (c2, "bad"), (c3, "committed")]
    # A bad checkpoint cannot be chosen; the good ones can.
    r = post(plane, f"/v1/jobs/{jid}/resume", json={"from": c2})
    assert r.status_code == 409 and r.json()["field"] == "from" and r.json()["state"] == "bad"
    assert r.json()["message"] == (f"checkpoint {c2} of job {jid} is bad (it failed verification) and cannot "
                                   "be restored")


def test_with_no_intact_checkpoint_left_the_job_fails_saying_so(plane: Plane) -> None:
    a, jid, (c1,), act = resumed(plane, 1)
    assert a.result(act, ok=False, **corrupt(c1))
    j = plane.job(jid)
    assert j["state"] == "failed" and j["restarts"] == 0
    assert j["error"] == (f"checkpoint {c1} is damaged and job {jid} has no other intact checkpoint to resume "
                          f"from; `tidal checkpoints {jid}` lists what is kept; submit the job again to start over")
    assert states(plane, jid) == [(c1, "bad")]


def test_other_restore_failures_are_retried_from_the_same_checkpoint(plane: Plane) -> None:
    a, jid, (c1, c2), act = resumed(plane, 2)
    assert a.result(act, ok=False)  # no verification failure: possibly transient
    j = plane.job(jid)
    assert j["state"] == "pending" and j["restarts"] == 1
    assert states(plane, jid) == [(c1, "committed"), (c2, "committed")]
    plane.rec.once()
    (act,) = a.actions()
    assert act["payload"]["checkpoint"]["id"] == c2


def test_damage_reported_for_another_checkpoint_is_an_ordinary_failure(plane: Plane) -> None:
    a, jid, (c1, c2), act = resumed(plane, 2)
    assert a.result(act, ok=False, **corrupt(c1))  # not the checkpoint this restore was given
    j = plane.job(jid)
    assert j["state"] == "pending" and j["restarts"] == 1
    assert states(plane, jid) == [(c1, "committed"), (c2, "committed")]


def test_resume_from_a_chosen_checkpoint(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid, (c1, c2, c3) = stopped_with(plane, a, 3)

    r = post(plane, f"/v1/jobs/{jid}/resume", json={"from": "000009-nope"})
    assert r.status_code == 422 and r.json()["field"] == "from"
    assert r.json()["message"] == f"job {jid} has no checkpoint '000009-nope'"
    r = post(plane, f"/v1/jobs/{jid}/resume", json={"from": 7})
    assert r.status_code == 422 and r.json()["field"] == "from"
    other, _ = stopped_with(plane, a, 1)
    r = post(plane, f"/v1/jobs/{other}/resume", json={"from": c1})  # another job's checkpoint
    assert r.status_code == 422 and r.json()["field"] == "from"
    assert plane.job(jid)["state"] == "preempted" and plane.job(jid)["held"]  # refused: nothing changed

    r = post(plane, f"/v1/jobs/{jid}/resume", json={"from": c1})
    assert r.status_code == 200 and r.json()["resume_from"] == c1
    plane.rec.once()
    (act,) = a.actions()
    assert act["payload"]["checkpoint"]["id"] == c1
    assert a.result(act, ranks=[{"rank": 0, "pid": 9}])
    r = post(plane, f"/v1/jobs/{jid}/resume", json={"from": c2})
    assert r.status_code == 409 and r.json()["field"] == "from" and r.json()["state"] == "running"

    # Lost before its next checkpoint: it is restored from the chosen one again, not from its newest.
    assert a.exit(jid, attempt=plane.job(jid)["attempt"], code=None, signal=9)
    plane.rec.once()
    (act,) = a.actions()
    assert act["payload"]["checkpoint"]["id"] == c1
    assert a.result(act, ranks=[{"rank": 0, "pid": 10}])
    # Its next checkpoint keeps the chosen one (the job resumes from it until then) and is the newest after.
    post(plane, f"/v1/jobs/{jid}/preempt")
    (act,) = a.actions()
    c4 = act["payload"]["checkpoint_id"]
    assert act["payload"]["keep_ids"] == [c1, c2, c3, c4]
    assert a.result(act, **committed(c4))
    assert plane.job(jid)["resume_from"] is None
    post(plane, f"/v1/jobs/{jid}/resume")
    plane.rec.once()
    (act,) = a.actions()
    assert act["payload"]["checkpoint"]["id"] == c4


def test_a_damaged_chosen_checkpoint_falls_back_to_an_older_one_else_to_the_newest(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid, (c1, c2, c3) = stopped_with(plane, a, 3)
    for chosen, then in ((c2, c1), (c1, c3)):  # c1 has nothing older: the newest good one it is
        assert post(plane, f"/v1/jobs/{jid}/resume", json={"from": chosen}).status_code == 200
        plane.rec.once()
        (act,) = a.actions()
        assert act["payload"]["checkpoint"]["id"] == chosen
        assert a.result(act, ok=False, **corrupt(chosen))
        assert plane.job(jid)["resume_from"] == then
        plane.rec.once()
        (act,) = a.actions()
        assert act["payload"]["checkpoint"]["id"] == then
        assert a.result(act, ranks=[{"rank": 0, "pid": 9}])
        # Its ranks are killed from outside: pending again, where it may be given a checkpoint to resume from.
        assert a.exit(jid, attempt=plane.job(jid)["attempt"], code=None, signal=9)
        assert plane.job(jid)["state"] == "pending"
    assert states(plane, jid) == [(c1, "bad"), (c2, "bad"), (c3, "committed")]


def _rows(*spec: str) -> list[CheckpointRow]:
    """Checkpoints c1, c2, ... oldest first; 'g' good, 'b' bad."""
    return [CheckpointRow(id=f"c{i}", job_id="j", created_at=float(i), bytes=1, stored_bytes=1, retained=True,
                          state=CheckpointState.COMMITTED if s == "g" else CheckpointState.BAD)
            for i, s in enumerate(spec, 1)]


def test_retention_counts_only_good_checkpoints_and_keeps_the_one_resumed_from() -> None:
    def ids(rows: list[CheckpointRow]) -> list[str]:
        return [r.id for r in rows]

    assert ids(retired(_rows("g", "g", "g", "g"), 3, None)) == ["c1"]
    assert ids(retired(_rows("g", "g", "g"), 3, None)) == []
    # Bad ones neither count towards K nor go.
    assert ids(retired(_rows("g", "b", "g", "b", "g"), 3, None)) == []
    assert ids(retired(_rows("b", "g", "g", "b", "g", "g"), 3, None)) == ["c2"]
    assert ids(retired(_rows("g", "b", "b", "b"), 1, None)) == []
    # The checkpoint the job resumes from stays whatever its age.
    assert ids(retired(_rows("g", "g", "g", "g", "g"), 2, "c1")) == ["c2", "c3"]
    assert ids(retired(_rows("g", "g", "g"), 0, "c3")) == ["c1", "c2"]


def test_retention_at_commit_keeps_bad_checkpoints_and_k_good_ones(plane: Plane) -> None:
    a, jid, (_, c2), act = resumed(plane, 2)
    assert a.result(act, ok=False, **corrupt(c2))
    plane.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 9}])
    made = []
    for _ in range(3):  # keep = 3: c1 then goes, c2 (bad) stays
        post(plane, f"/v1/jobs/{jid}/preempt")
        (act,) = a.actions()
        made.append(act["payload"]["checkpoint_id"])
        assert a.result(act, **committed(made[-1]))
        post(plane, f"/v1/jobs/{jid}/resume")
        plane.rec.once()
        (act,) = a.actions()
        assert a.result(act, ranks=[{"rank": 0, "pid": 10}])
    assert act["payload"]["checkpoint"]["id"] == made[-1]
    assert states(plane, jid) == [(c2, "bad")] + [(c, "committed") for c in made]
    post(plane, f"/v1/jobs/{jid}/preempt")
    (act,) = a.actions()
    # The agent keeps all the control plane still lists (c2, bad, and the newest 3), and the new one: the
    # oldest good one goes only once the new one is committed.
    new = act["payload"]["checkpoint_id"]
    assert act["payload"]["keep_ids"] == [c2, *made, new]
    assert a.result(act, **committed(new))
    assert states(plane, jid) == [(c2, "bad")] + [(c, "committed") for c in [*made[1:], new]]


def upgrade_from_0003(url: str) -> None:
    """Migration 0004 on a database holding a checkpoint from before it (also run on PostgreSQL, in
    tests/system/test_postgres.py): the checkpoint is committed, a state outside committed | bad is refused,
    and it downgrades."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import inspect, text
    from sqlalchemy.exc import IntegrityError

    from tidal.control.store.db import MIGRATIONS, Database

    db = Database(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))

    def to(revision: str, up: bool = True) -> None:
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            (command.upgrade if up else command.downgrade)(cfg, revision)

    to("0003")
    with db.engine.begin() as conn:
        conn.execute(text("INSERT INTO checkpoints (id, job_id, created_at, bytes, stored_bytes, retained) "
                          "VALUES ('c1', 'j', 1.0, 1, 1, :yes)"), {"yes": True})
    db.migrate()
    with db.tx() as s:
        row = s.get(CheckpointRow, "c1")
        assert row is not None and row.state is CheckpointState.COMMITTED
        row.state = CheckpointState.BAD
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM checkpoints")).scalar_one() == "bad"
    with pytest.raises(IntegrityError), db.engine.begin() as conn:
        conn.execute(text("UPDATE checkpoints SET state = 'broken'"))
    assert "resume_from" in {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    to("0003", up=False)
    assert "state" not in {c["name"] for c in inspect(db.engine).get_columns("checkpoints")}
    assert "resume_from" not in {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    db.migrate()
    with db.read() as s:
        assert [r.state for r in s.query(CheckpointRow)] == [CheckpointState.COMMITTED]
    db.close()


def test_migration_0004_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0003(f"sqlite:///{tmp_path / 'old.db'}")
