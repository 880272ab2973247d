"""Pre-staging a migration's target, as the control plane decides it (scripted agents): a node that ranks move
onto is sent a prestage of the checkpoint the job descends from as the migration starts, beside the
checkpoint; the restore follows there and keeps what was fetched; a migration that ends without restoring
there has the node drop it; a prestage that fails, or that an older agent refuses, changes nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tidal.control.store.models import ActionRow, JobRow
from tidal.core.operations import Phase
from tidal.testing.control import FakeAgent, Plane, checkpoint_result


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Plane, FakeAgent, FakeAgent, FakeAgent]]:
    p = Plane(tmp_path)
    a, b, c = (FakeAgent(p, f"node-{i}", f"A{i}", devices=2) for i in (1, 2, 3))
    assert a.register() == 200
    yield p, a, b, c
    p.db.close()


def kinds(acts: list[dict[str, Any]]) -> list[str]:
    return [x["kind"] for x in acts]


def started(agent: FakeAgent, act: dict[str, Any]) -> None:
    assert act["kind"] in ("launch", "restore"), act
    assert agent.result(act, ranks=[{"rank": r["rank"], "pid": 100 + r["rank"]} for r in act["payload"]["ranks"]])


def running(p: Plane, a: FakeAgent, others: tuple[FakeAgent, ...], ranks: int = 1) -> str:
    """A job of ``ranks`` ranks running on ``a`` (the others register once it is placed)."""
    jid = p.submit(ranks=ranks)
    p.rec.once()
    (act,) = a.actions()
    started(a, act)
    for o in others:
        assert o.register() == 200
    return jid


def migrate(p: Plane, jid: str, **body: Any) -> None:
    r = p.http.post(f"/v1/jobs/{jid}/migrate", headers=p.as_user(), json=body)
    assert r.status_code == 200, r.text


def checkpointed(agent: FakeAgent, ck: str, ok: bool = True) -> None:
    (act,) = agent.actions()
    assert act["kind"] == "checkpoint", act
    assert agent.result(act, ok, **(checkpoint_result(ck) if ok else {}))


def committed(p: Plane, jid: str) -> list[str]:
    return [c["id"] for c in p.job(jid)["checkpoints"]]


def moved_once(p: Plane, a: FakeAgent, b: FakeAgent) -> str:
    """A job migrated from node-1 to node-2 (with nothing to prestage: it had no checkpoint yet)."""
    jid = running(p, a, (b,))
    migrate(p, jid, to="node-2")
    checkpointed(a, "000001-a")
    (act,) = b.actions()  # the restore alone
    started(b, act)
    assert p.job(jid)["state"] == "running" and len(committed(p, jid)) == 1
    return jid


def test_a_job_without_a_checkpoint_is_migrated_without_a_prestage(nodes: tuple[Plane, FakeAgent, FakeAgent,
                                                                                FakeAgent]) -> None:
    p, a, b, _ = nodes
    jid = moved_once(p, a, b)
    assert not [e for e in p.job(jid)["events"] if "prestage" in e["kind"]]


def test_the_target_prestages_the_last_checkpoint_while_the_source_checkpoints(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent]) -> None:
    p, a, b, _ = nodes
    jid = moved_once(p, a, b)
    (last,) = committed(p, jid)
    migrate(p, jid, to="node-1")
    # Both at once: the checkpoint on the node it runs on, the prestage on the one it moves to.
    (prestage,) = a.actions()
    assert prestage["kind"] == "prestage"
    # The parts as the store names them.
    assert prestage["payload"]["checkpoint"] == {"id": last, "parts": ["000001-a"], "source": None}
    assert prestage["payload"]["ranks"] == [0] and prestage["payload"]["attempt"] == 2
    with p.db.read() as s:
        job = s.get(JobRow, jid)
        assert job is not None and job.phase is Phase.CHECKPOINT  # not a step of the operation
    assert a.result(prestage, checkpoint=last, ranks=[0], bytes=300 << 20, seconds=2.5)
    assert p.job(jid)["state"] == "checkpointing"
    checkpointed(b, "000002-b")
    (restore,) = a.actions()
    assert restore["kind"] == "restore" and restore["payload"]["attempt"] == 3
    started(a, restore)
    j = p.job(jid)
    assert j["state"] == "running" and j["placement"][0]["node"] == "node-1"
    (ev,) = [e for e in j["events"] if e["kind"] == "prestaged"]
    assert ev["node"] == "node-1" and last in ev["detail"] and "300.0 MiB" in ev["detail"]
    # The restore used it: nobody is told to drop it.
    assert a.actions() == [] and b.actions() == []


@pytest.mark.parametrize("error", ["boom", "the agent on node-1 did not run it: bad action: order.kind: ..."])
def test_a_failed_or_refused_prestage_leaves_the_migration_to_a_full_restore(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent], error: str) -> None:
    p, a, b, _ = nodes
    jid = moved_once(p, a, b)
    migrate(p, jid, to="node-1")
    (prestage,) = a.actions()
    r = p.http.post("/v1/agent/node-1/results", headers=p.as_agent(), json={
        "agent_id": a.id, "action_id": prestage["id"], "ok": False, "data": {}, "error": error})
    assert r.status_code == 200 and r.json()["applied"]
    assert p.job(jid)["state"] == "checkpointing"
    checkpointed(b, "000002-b")
    (restore,) = a.actions()
    started(a, restore)
    j = p.job(jid)
    assert j["state"] == "running" and j["placement"][0]["node"] == "node-1"
    (ev,) = [e for e in j["events"] if e["kind"] == "prestage_failed"]
    assert error in ev["detail"] and "whole checkpoint" in ev["detail"]


def test_a_failed_migration_has_the_target_drop_what_it_prestaged(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent]) -> None:
    p, a, b, _ = nodes
    jid = moved_once(p, a, b)
    migrate(p, jid, to="node-1")
    (prestage,) = a.actions()
    checkpointed(b, "000002-b", ok=False)
    assert p.job(jid)["state"] == "running" and p.job(jid)["placement"][0]["node"] == "node-2"
    (unstage,) = a.actions()
    assert unstage["kind"] == "unstage" and unstage["payload"]["attempt"] == prestage["payload"]["attempt"]
    assert b.actions() == []
    # The prestage's late answer changes nothing.
    assert a.result(prestage, checkpoint=prestage["payload"]["checkpoint"]["id"], ranks=[0], bytes=1, seconds=0.1)
    assert a.result(unstage)
    assert p.job(jid)["state"] == "running"


def test_a_job_cancelled_while_migrating_has_the_target_drop_what_it_prestaged(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent]) -> None:
    p, a, b, _ = nodes
    jid = moved_once(p, a, b)
    migrate(p, jid, to="node-1")
    assert kinds(a.actions()) == ["prestage"]
    assert p.http.post(f"/v1/jobs/{jid}/cancel", headers=p.as_user()).status_code == 200
    assert kinds(a.actions()) == ["unstage"]
    assert "kill" in kinds(b.actions())


def test_a_migration_whose_target_is_lost_unstages_nothing_there_and_requeues(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent]) -> None:
    p, a, b, c = nodes
    jid = moved_once(p, a, b)
    assert c.register() == 200
    migrate(p, jid, to="node-3")
    assert kinds(c.actions()) == ["prestage"]
    r = p.http.post("/v1/agent/node-3/leave", headers=p.as_agent(), json={"agent_id": c.id})
    assert r.status_code == 200, r.text
    checkpointed(b, "000002-b")
    assert p.job(jid)["state"] == "preempted"
    with p.db.read() as s:
        assert [x.kind for x in s.scalars(select(ActionRow).where(ActionRow.node == "node-3"))] == ["prestage"]


def test_a_rank_moved_onto_another_node_is_prestaged_there_and_the_ranks_that_stay_are_not(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent]) -> None:
    p, a, b, c = nodes
    jid = running(p, a, (b, c), ranks=2)
    # A first move gives the job a checkpoint: rank 1 onto node-2.
    migrate(p, jid, to="node-2", rank=1)
    checkpointed(a, "000001-a")
    for ag in (a, b):
        (act,) = ag.actions()
        started(ag, act)
    assert p.job(jid)["state"] == "running"
    (last,) = committed(p, jid)
    # Rank 1 again, onto node-3: only node-3 prestages, only rank 1; the job's nodes are checkpointing.
    migrate(p, jid, to="node-3", rank=1)
    (prestage,) = c.actions()
    assert prestage["kind"] == "prestage" and prestage["payload"]["ranks"] == [1]
    assert prestage["payload"]["checkpoint"]["id"] == last
    assert kinds(a.actions()) == ["cut"] and kinds(b.actions()) == ["cut"]


def test_the_images_are_kept_on_the_node_only_for_ranks_restored_there(
        nodes: tuple[Plane, FakeAgent, FakeAgent, FakeAgent]) -> None:
    """A checkpoint whose ranks are restored on the same node next (a resize) says so (``restore_here``: the
    agent keeps the images it dumped, the restore fetches nothing); a move to another node and a preemption
    do not."""
    p, a, b, _ = nodes
    jid = running(p, a, (b,), ranks=2)

    def order(act: dict[str, Any]) -> tuple[str, bool]:
        return act["payload"]["then"], act["payload"]["restore_here"]

    r = p.http.post(f"/v1/jobs/{jid}/resize", headers=p.as_user(), json={"devices": 1})
    assert r.status_code == 200, r.text
    (act,) = a.actions()
    assert order(act) == ("kill", True)
    assert a.result(act, **checkpoint_result("000001-a"))
    (act,) = a.actions()
    started(a, act)
    migrate(p, jid, to="node-2")
    (act,) = [x for x in a.actions() if x["kind"] == "checkpoint"]
    assert order(act) == ("kill", False)
    assert a.result(act, **checkpoint_result("000002-b"))
    (act,) = [x for x in b.actions() if x["kind"] == "restore"]
    started(b, act)
    r = p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
    assert r.status_code == 200, r.text
    (act,) = b.actions()
    assert order(act) == ("kill", False)
