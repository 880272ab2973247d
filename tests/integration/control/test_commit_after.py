"""A resize (or a move) that keeps every rank on the job's node, as the control plane drives it (scripted
agents): the node answers once the ranks are dumped, the job is restored there from those images at once, and
the checkpoint becomes the job's only when the node reports its commit. Until then, and for good if the commit
fails or the node is lost, the job's older committed checkpoint is the one to fall back to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.control.jobs import restore_source
from tidal.control.store.models import JobRow
from tidal.testing.control import FakeAgent, Plane, checkpoint_result


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path)
    yield p
    p.db.close()


def started(agent: FakeAgent, act: dict[str, Any]) -> None:
    assert act["kind"] in ("launch", "restore"), act
    assert agent.result(act, ranks=[{"rank": r["rank"], "pid": 100 + r["rank"]} for r in act["payload"]["ranks"]])


def checkpoints(p: Plane, jid: str) -> list[tuple[str, str]]:
    return [(c["id"], c["state"]) for c in p.job(jid)["checkpoints"]]


def fallback(p: Plane, jid: str) -> str | None:
    with p.db.read() as s:
        job = s.get(JobRow, jid)
        assert job is not None
        src = restore_source(s, job)
        return src.id if src is not None else None


def resized_on_one_node(p: Plane, a: FakeAgent, jid: str, devices: int, committing: bool = True) -> str:
    """Resize the job to ``devices`` on its node; the node answers the checkpoint dumped (its commit under way
    when ``committing``) and is told to restore the job from it at once. The checkpoint's id."""
    r = p.http.post(f"/v1/jobs/{jid}/resize", headers=p.as_user(), json={"devices": devices})
    assert r.status_code == 200, r.text
    (act,) = a.actions()
    assert act["kind"] == "checkpoint" and act["payload"]["commit_after"] and act["payload"]["restore_here"], act
    ck = str(act["payload"]["checkpoint_id"])
    assert a.result(act, **checkpoint_result(ck, size=1000, committing=committing))
    (act,) = a.actions()
    assert act["kind"] == "restore" and act["payload"]["checkpoint"]["id"] == ck, act
    started(a, act)
    assert p.job(jid)["state"] == "running"
    return ck


@pytest.fixture
def job(plane: Plane) -> tuple[Plane, FakeAgent, str]:
    a = FakeAgent(plane, "node-1", "A1", devices=2)
    assert a.register() == 200
    jid = plane.submit(ranks=2, min_devices=1)
    plane.rec.once()
    (act,) = a.actions()
    started(a, act)
    return plane, a, jid


def test_restored_at_once_from_its_dump_and_the_checkpoint_counts_once_committed(
        job: tuple[Plane, FakeAgent, str]) -> None:
    p, a, jid = job
    c1 = resized_on_one_node(p, a, jid, 1, committing=False)  # an agent that answers once committed
    assert checkpoints(p, jid) == [(c1, "committed")]
    c2 = resized_on_one_node(p, a, jid, 2)
    assert checkpoints(p, jid) == [(c1, "committed"), (c2, "committing")]
    assert fallback(p, jid) == c1  # not yet a checkpoint of the job
    r = p.http.post(f"/v1/jobs/{jid}/resume", headers=p.as_user(), json={"from": c2})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (f"checkpoint {c2} of job {jid} is still being committed to the store and cannot "
                                   "be chosen yet")
    attempt = p.job(jid)["attempt"]
    assert a.committed(jid, attempt, c2, size=1234, stored=56)
    assert not a.committed(jid, attempt, c2)  # sent again: applied once
    assert checkpoints(p, jid) == [(c1, "committed"), (c2, "committed")]
    assert fallback(p, jid) == c2
    (row,) = [c for c in p.job(jid)["checkpoints"] if c["id"] == c2]
    assert (row["bytes"], row["stored_bytes"]) == (1234, 56)
    (ev,) = [e for e in p.job(jid)["events"] if e["kind"] == "committed"]
    assert ev["detail"] == f"checkpoint {c2} committed (1.2 KiB, 56 B new) while the job ran on from its images"


def test_a_commit_that_fails_leaves_the_older_checkpoint_the_fallback(job: tuple[Plane, FakeAgent, str]) -> None:
    p, a, jid = job
    c1 = resized_on_one_node(p, a, jid, 1, committing=False)
    c2 = resized_on_one_node(p, a, jid, 2)
    assert a.committed(jid, p.job(jid)["attempt"], c2, ok=False)
    assert checkpoints(p, jid) == [(c1, "committed")]
    assert fallback(p, jid) == c1 and p.job(jid)["state"] == "running"
    (ev,) = [e for e in p.job(jid)["events"] if e["kind"] == "checkpoint_failed"]
    assert ev["detail"] == (f"checkpoint {c2} was not committed (disk full): the job runs on from the images it "
                            f"was restored from; checkpoint {c1} stays the one to fall back to")


def test_a_node_lost_before_the_commit_ended_gives_it_up(job: tuple[Plane, FakeAgent, str]) -> None:
    p, a, jid = job
    c1 = resized_on_one_node(p, a, jid, 1, committing=False)
    c2 = resized_on_one_node(p, a, jid, 2)
    r = p.http.post("/v1/agent/node-1/leave", headers=p.as_agent(), json={"agent_id": a.id})
    assert r.status_code == 200, r.text
    j = p.job(jid)
    assert j["state"] in ("pending", "preempted"), j["state"]
    assert checkpoints(p, jid) == [(c1, "committed")]
    assert f"checkpoint {c2} was not committed: node node-1 was lost before its commit ended" in [
        e["detail"] for e in j["events"] if e["kind"] == "checkpoint_failed"]
    assert fallback(p, jid) == c1


def test_a_job_resumed_from_an_older_checkpoint_goes_on_from_the_one_committed_after(
        job: tuple[Plane, FakeAgent, str]) -> None:
    """Set to resume from an older checkpoint, the job keeps it as its fallback while the next one is being
    committed, and goes on from that one once it is (as from any committed checkpoint)."""
    p, a, jid = job
    c1 = resized_on_one_node(p, a, jid, 1, committing=False)
    resized_on_one_node(p, a, jid, 2, committing=False)
    r = p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
    assert r.status_code == 200, r.text
    (act,) = a.actions()
    assert a.result(act, **checkpoint_result(str(act["payload"]["checkpoint_id"])))
    assert p.job(jid)["state"] == "preempted"
    r = p.http.post(f"/v1/jobs/{jid}/resume", headers=p.as_user(), json={"from": c1})
    assert r.status_code == 200, r.text
    p.rec.once()
    (act,) = a.actions()
    assert act["payload"]["checkpoint"]["id"] == c1
    started(a, act)
    c4 = resized_on_one_node(p, a, jid, 1)
    assert fallback(p, jid) == c1  # what the running job descends from, until c4 is committed
    assert a.committed(jid, p.job(jid)["attempt"], c4)
    assert fallback(p, jid) == c4
