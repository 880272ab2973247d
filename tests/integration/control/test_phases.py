"""A job's operation through its phases on a real control plane (database, API, reconcile loop) with
scripted agents: the phase column follows the table step by step, a result of the wrong kind for the
phase changes nothing, and every outcome ends idle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.control.store.models import JobRow
from tidal.core.operations import Phase
from tidal.testing.control import FakeAgent, Plane, checkpoint_result


def kind(act: dict[str, Any]) -> str:
    return str(act.get("kind") or act["order"]["kind"])


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[Plane, FakeAgent, FakeAgent]]:
    p = Plane(tmp_path)
    a, b = FakeAgent(p, "node-1", "A"), FakeAgent(p, "node-2", "B")
    assert a.register() == 200 and b.register() == 200
    yield p, a, b
    p.db.close()


def phase(p: Plane, jid: str) -> Phase:
    with p.db.read() as s:
        job = s.get(JobRow, jid)
        assert job is not None
        return job.phase


def answer_all(agents: tuple[FakeAgent, ...], want: str, **data: Any) -> None:
    acts = [(ag, act) for ag in agents for act in ag.actions()]
    assert [kind(act) for _, act in acts] == [want] * len(agents)
    for ag, act in acts:
        assert ag.result(act, **data)


def launched(p: Plane, a: FakeAgent, b: FakeAgent) -> str:
    jid = p.submit(ranks=2)
    p.rec.once()
    assert phase(p, jid) is Phase.STARTING
    assert a.result(a.actions()[0], ranks=[{"rank": 0, "pid": 10}])
    assert phase(p, jid) is Phase.STARTING  # node-2 has not answered yet
    assert b.result(b.actions()[0], ranks=[{"rank": 1, "pid": 11}])
    assert phase(p, jid) is Phase.IDLE and p.job(jid)["state"] == "running"
    return jid


def test_a_preemption_over_two_nodes_goes_cut_park_dump_finish(two_nodes: tuple[Plane, FakeAgent, FakeAgent]) -> None:
    p, a, b = two_nodes
    jid = launched(p, a, b)
    assert p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user()).status_code == 200
    assert phase(p, jid) is Phase.CUT
    answer_all((a, b), "cut", counts={"0": 7})
    assert phase(p, jid) is Phase.PARK
    answer_all((a, b), "park")
    assert phase(p, jid) is Phase.DUMP
    for ag in (a, b):
        (act,) = ag.actions()
        assert kind(act) == "checkpoint"
        part = (act.get("payload") or act["order"])["checkpoint_id"]
        assert ag.result(act, **checkpoint_result(part))
    assert phase(p, jid) is Phase.FINISH
    answer_all((a, b), "finish")
    assert phase(p, jid) is Phase.IDLE
    j = p.job(jid)
    assert j["state"] == "preempted" and j["held"] and len(j["checkpoints"]) == 1


def test_a_failed_cut_lets_every_rank_go_on_through_finish(two_nodes: tuple[Plane, FakeAgent, FakeAgent]) -> None:
    p, a, b = two_nodes
    jid = launched(p, a, b)
    p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
    (cut_a,), (cut_b,) = a.actions(), b.actions()
    assert a.result(cut_a, counts={"0": 3})
    assert b.result(cut_b, ok=False)
    assert phase(p, jid) is Phase.FINISH
    finishes = [(ag, act) for ag in (a, b) for act in ag.actions()]
    assert [(act.get("payload") or act["order"])["then"] for _, act in finishes] == ["resume", "resume"]
    for ag, act in finishes:
        assert ag.result(act)
    assert phase(p, jid) is Phase.IDLE
    j = p.job(jid)
    assert j["state"] == "running" and j["checkpoints"] == []
    assert "hold checkpoint failed, the job goes on: node-2: boom" in [e["detail"] for e in j["events"]]


def test_a_rank_failing_during_a_checkpoint_settles_to_idle(two_nodes: tuple[Plane, FakeAgent, FakeAgent]) -> None:
    p, a, b = two_nodes
    jid = launched(p, a, b)
    p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
    assert phase(p, jid) is Phase.CUT
    assert a.exit(jid, attempt=1, code=3)
    assert phase(p, jid) is Phase.FAILING
    (kill,) = [act for act in b.actions() if kind(act) == "kill"]
    assert b.result(kill, ranks=[{"rank": 1, "code": None, "signal": 9, "stopped": True}])
    assert phase(p, jid) is Phase.IDLE
    j = p.job(jid)
    assert j["state"] == "failed" and j["error"].startswith("rank 0 exited with code 3 (root cause)")


def order(act: dict[str, Any]) -> dict[str, Any]:
    return dict(act.get("payload") or act["order"])


def test_a_need_on_one_node_starts_another_park_round_on_every_node_at_once(
        two_nodes: tuple[Plane, FakeAgent, FakeAgent]) -> None:
    # Rank 0 (node-1) and rank 1 (node-2) share the world group "0"; rank 0 also sends to rank 1 on "0:0>1:0".
    p, a, b = two_nodes
    jid = launched(p, a, b)
    assert p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user()).status_code == 200
    world = {"count": 5, "members": [0, 1]}
    (cut_a,), (cut_b,) = a.actions(), b.actions()
    assert a.result(cut_a, counts={"0": 5}, default="0", comms={"0": world, "0:0>1:0": {"count": 2, "members": [0, 1]}})
    assert b.result(cut_b, counts={"1": 4}, default="0", comms={"0": {**world, "count": 4}})
    assert phase(p, jid) is Phase.PARK
    (park_a,), (park_b,) = a.actions(), b.actions()
    for act in (park_a, park_b):
        assert {k: order(act)[k] for k in ("target", "targets", "members", "version")} == {
            "target": 5, "targets": {"0": 5, "0:0>1:0": 2}, "members": {"0": [0, 1], "0:0>1:0": [0, 1]},
            "version": 0}
    # node-2's rank 1 must receive once more before it can reach collective 5: node-1's rank waits for it
    # there, so node-1 does not answer; the next round goes out at once, node-2's answer alone.
    assert b.result(park_b, version=0, needs=[{"key": "0:0>1:0", "members": [0, 1], "count": 3}])
    assert phase(p, jid) is Phase.PARK
    (again_a,), (again_b,) = a.actions(), b.actions()
    for act in (again_a, again_b):
        assert order(act)["targets"] == {"0": 5, "0:0>1:0": 3} and order(act)["version"] == 1
    assert a.result(park_a)  # the first round's late answer counts no more
    assert phase(p, jid) is Phase.PARK
    assert a.result(again_a, version=1) and b.result(again_b, version=1)
    assert phase(p, jid) is Phase.DUMP
    for ag in (a, b):
        (act,) = ag.actions()
        assert kind(act) == "checkpoint"
        assert order(act)["cut"] == {"epoch": order(again_a)["epoch"], "target": 5,
                                     "targets": {"0": 5, "0:0>1:0": 3}, "version": 1}
        assert ag.result(act, **checkpoint_result(order(act)["checkpoint_id"]))
    answer_all((a, b), "finish")
    assert phase(p, jid) is Phase.IDLE and p.job(jid)["state"] == "preempted"


def test_an_older_agents_world_group_count_parks_at_one_target(two_nodes: tuple[Plane, FakeAgent, FakeAgent]) -> None:
    p, a, b = two_nodes
    jid = launched(p, a, b)
    p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
    (cut_a,), (cut_b,) = a.actions(), b.actions()
    assert a.result(cut_a, counts={"0": 7})
    assert b.result(cut_b, counts={"1": 9})
    for ag in (a, b):
        (act,) = ag.actions()
        assert {k: v for k, v in order(act).items() if k in ("target", "targets", "version")} == {
            "target": 9, "targets": None, "version": 0}


def test_sub_groups_with_an_older_agent_on_a_node_fail_the_cut_and_the_job_goes_on(
        two_nodes: tuple[Plane, FakeAgent, FakeAgent]) -> None:
    p, a, b = two_nodes
    jid = launched(p, a, b)
    p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
    (cut_a,), (cut_b,) = a.actions(), b.actions()
    assert a.result(cut_a, counts={"0": 7}, default="0", comms={"0": {"count": 7, "members": [0, 1]},
                                                               "0:0>1:0": {"count": 1, "members": [0, 1]}})
    assert b.result(cut_b, counts={"1": 7})
    assert phase(p, jid) is Phase.FINISH
    answer_all((a, b), "finish")
    j = p.job(jid)
    assert j["state"] == "running" and j["checkpoints"] == []
    assert any("an agent of an older release on one of its nodes cannot cut" in e["detail"] for e in j["events"])
