"""GPU nodes on a real control plane (API, SQLite database), registered by scripted agents: what the
control plane keeps of each device's GPU and shows in the API's node view, with the jobs on each device; and
the GPU memory of a job's ranks, which its nodes report, against the GPUs a resize or a move would splice them
onto. No GPU is involved: the GPUs are what a scripted agent says it found."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from tests.integration.control.store.revisions import columns, to
from tidal.control.reconcile import Reconciler
from tidal.control.store.db import Database
from tidal.control.store.models import EventRow, JobRow, NodeRow
from tidal.core import Action, ActionKind, ClusterView, DeviceRef, Event
from tidal.policy.reasons import Reason
from tidal.testing.control import FakeAgent, Plane, checkpoint_result

H100 = "NVIDIA H100 80GB HBM3"
MEM = 85520809984
GPUS = [{"index": i, "uuid": f"GPU-{i}0000000-0000-0000-0000-000000000000", "model": H100, "memory_bytes": MEM}
        for i in range(2)]


def nodes(p: Plane) -> dict[str, dict[str, Any]]:
    r = p.http.get("/v1/nodes", headers=p.as_user())
    assert r.status_code == 200, r.text
    return {n["name"]: n for n in r.json()}


def test_a_gpu_node_shows_each_devices_gpu_and_the_jobs_on_it(plane: Plane) -> None:
    gpu = FakeAgent(plane, "gpu-1", "A", devices=2, gpus=GPUS)
    assert gpu.register() == 200
    cpu = FakeAgent(plane, "cpu-1", "B", devices=1)
    assert cpu.register() == 200
    shown = nodes(plane)
    assert shown["cpu-1"]["gpus"] is None
    assert shown["gpu-1"]["gpus"] == [{"device": i, **g, "jobs": []} for i, g in enumerate(GPUS)]
    with plane.db.read() as s:
        details = [e.detail for e in s.scalars(select(EventRow).where(EventRow.kind == "node_up"))]
    assert details == [f"2 GPU(s) ({H100}) in local/local", "1 device(s) in local/local"]

    jid = plane.submit(ranks=2)
    plane.rec.once()
    (act,) = gpu.actions()
    assert [r["device"] for r in act["payload"]["ranks"]] == [0, 1]
    assert gpu.result(act, ranks=[{"rank": 0, "pid": 11}, {"rank": 1, "pid": 12}])
    assert [g["jobs"] for g in nodes(plane)["gpu-1"]["gpus"]] == [[jid], [jid]]


def test_a_node_registered_again_with_cpu_devices_forgets_its_gpus(plane: Plane) -> None:
    assert FakeAgent(plane, "n1", "A", devices=2, gpus=GPUS).register() == 200
    assert nodes(plane)["n1"]["gpus"] is not None
    plane.http.post("/v1/agent/n1/leave", headers=plane.as_agent(), json={"agent_id": "A"})
    assert FakeAgent(plane, "n1", "B", devices=2).register() == 200
    assert nodes(plane)["n1"]["gpus"] is None


def test_a_registration_whose_gpus_do_not_match_its_devices_is_refused(plane: Plane) -> None:
    r = plane.http.post("/v1/agent/register", headers=plane.as_agent(), json={
        "name": "n1", "agent_id": "A", "devices": 3, "cpus": [[0], [1], [2]], "gpus": GPUS})
    assert r.status_code == 422, r.text
    assert "2 GPUs for 3 device(s): give one per device" in r.text


def test_migration_0011_keeps_the_nodes_registered_before_as_cpu_nodes(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    to(db, "0010")
    table = sa.table("nodes", *(sa.column(c) for c in ("name", "region", "cluster", "devices", "agent_id",
                                                       "lease_until", "up", "registered_at")),
                     sa.column("cpus", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(table).values(name="n1", region="local", cluster="local", devices=1, cpus=[[0]],
                                             agent_id="A", lease_until=0.0, up=False, registered_at=0.0))
    assert "gpus" not in columns(db, "nodes")
    db.migrate()
    with db.tx() as s:
        node = s.get(NodeRow, "n1")
        assert node is not None and node.gpus is None
        node.gpus = GPUS[:1]
    with db.read() as s:
        assert s.get(NodeRow, "n1").gpus == GPUS[:1]  # type: ignore[union-attr]
    to(db, "0010", up=False)
    assert "gpus" not in columns(db, "nodes")
    db.close()


# -- GPU memory: ranks spliced onto one GPU share it only if they fit ------------------------------------------
GIB = 1 << 30


def _heartbeat(p: Plane, agent: FakeAgent, jid: str, **figures: float) -> None:
    r = p.http.post(f"/v1/agent/{agent.name}/heartbeat", headers=p.as_agent(),
                    json={"agent_id": agent.id, "jobs": {jid: {"attempt": 1, **figures}}})
    assert r.status_code == 200, r.text


def _running_on_gpus(p: Plane, rank_bytes: int, ranks: int = 2) -> tuple[str, FakeAgent]:
    """A job of ``ranks`` ranks (elastic down to 1 device) running on gpu-1, one rank on each of its H100s,
    whose ranks were seen using up to ``rank_bytes`` of GPU memory each."""
    gpus = [{**GPUS[0], "index": i, "uuid": f"GPU-{i}0000000-0000-0000-0000-000000000000"} for i in range(ranks)]
    gpu = FakeAgent(p, "gpu-1", "A", devices=ranks, gpus=gpus)
    assert gpu.register() == 200
    jid = p.submit(ranks=ranks, min_devices=1)
    p.rec.once()
    (act,) = gpu.actions()
    assert gpu.result(act, ranks=[{"rank": r, "pid": 11 + r} for r in range(ranks)])
    _heartbeat(p, gpu, jid, cpu_s=1.0, gpu_rank_bytes=rank_bytes)
    assert p.job(jid)["progress"]["gpu_rank_bytes"] == rank_bytes
    return jid, gpu


def _unchanged(p: Plane, jid: str, gpu: FakeAgent) -> None:
    """The job runs as it did, one rank on each GPU, with nothing under way: no target, no pin, no checkpoint."""
    j = p.job(jid)
    assert (j["state"], j["busy"], j["devices"], j["pinned_devices"]) == ("running", False, len(j["placement"]), None)
    assert [(x["node"], x["device"]) for x in j["placement"]] == [("gpu-1", i) for i in range(len(j["placement"]))]
    assert not any(e["kind"] in ("resize", "resize_pinned", "checkpointing") for e in j["events"]), j["events"]
    with p.db.read() as s:
        row = s.get(JobRow, jid)
        assert row is not None and not row.target and row.op is None
    assert gpu.actions() == []


@pytest.mark.parametrize(("ranks", "devices", "rank_gib", "message", "hint"), [
    (2, 1, 50, "cannot run on 1 device: its ranks use up to 50.0 GiB of GPU memory each, and 2 of them on node "
               f"gpu-1's GPU 0 ({H100}, 79.6 GiB) need 100.0 GiB",
     "no two of its ranks fit together on a GPU of 79.6 GiB, so it needs the 2 devices it runs on"),
    (4, 1, 30, "cannot run on 1 device: its ranks use up to 30.0 GiB of GPU memory each, and 4 of them on node "
               f"gpu-1's GPU 0 ({H100}, 79.6 GiB) need 120.0 GiB",
     "at most 2 of its ranks fit together on a GPU of 79.6 GiB, so it needs at least 2 devices (`tidal resize "
     "JOB --devices 2`)"),
    (4, 2, 60, "cannot run on 2 devices: its ranks use up to 60.0 GiB of GPU memory each, and 2 of them on node "
               f"gpu-1's GPU 0 ({H100}, 79.6 GiB) need 120.0 GiB (and likewise on 1 other GPU(s))",
     "no two of its ranks fit together on a GPU of 79.6 GiB, so it needs the 4 devices it runs on"),
])
def test_a_resize_that_splices_ranks_whose_gpu_memory_does_not_fit_is_refused(
        plane: Plane, ranks: int, devices: int, rank_gib: int, message: str, hint: str) -> None:
    jid, gpu = _running_on_gpus(plane, rank_gib * GIB, ranks)
    r = plane.http.post(f"/v1/jobs/{jid}/resize", headers=plane.as_user(), json={"devices": devices})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == f"job {jid} {message}"
    assert r.json()["hint"] == hint.replace("JOB", jid) + "; it goes on running as it was"
    assert r.json()["field"] == "devices"
    _unchanged(plane, jid, gpu)


def test_a_resize_whose_ranks_fit_together_proceeds(plane: Plane) -> None:
    jid, gpu = _running_on_gpus(plane, 30 * GIB)  # 60 GiB of 79.6 on one GPU
    r = plane.http.post(f"/v1/jobs/{jid}/resize", headers=plane.as_user(), json={"devices": 1})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": jid, "state": "checkpointing", "held": False, "devices": 1, "pinned": True}
    (act,) = gpu.actions()
    assert act["kind"] == "checkpoint"
    assert gpu.result(act, **checkpoint_result("000001-a"))
    (restore,) = gpu.actions()
    assert restore["kind"] == "restore"
    assert [x["device"] for x in restore["payload"]["ranks"]] == [0, 0]
    assert {"resize", "checkpointing"} <= {e["kind"] for e in plane.job(jid)["events"]}


def test_a_job_never_measured_on_a_gpu_resizes_as_before(plane: Plane) -> None:
    jid, gpu = _running_on_gpus(plane, 50 * GIB)
    with plane.db.tx() as s:
        row = s.get(JobRow, jid)
        assert row is not None
        row.progress = {k: v for k, v in (row.progress or {}).items() if k != "gpu_rank_bytes"}
    r = plane.http.post(f"/v1/jobs/{jid}/resize", headers=plane.as_user(), json={"devices": 1})
    assert r.status_code == 200, r.text
    assert [a["kind"] for a in gpu.actions()] == ["checkpoint"]


def test_the_largest_rank_over_the_nodes_is_the_jobs_figure(plane: Plane) -> None:
    a = FakeAgent(plane, "gpu-1", "A", devices=1, gpus=GPUS[:1])
    b = FakeAgent(plane, "gpu-2", "B", devices=1, gpus=GPUS[:1])
    assert a.register() == 200 and b.register() == 200
    jid = plane.submit(ranks=2)
    plane.rec.once()
    for agent in (a, b):
        (act,) = agent.actions()
        assert agent.result(act, ranks=[{"rank": x["rank"], "pid": 10 + x["rank"]} for x in act["payload"]["ranks"]])
    _heartbeat(plane, a, jid, cpu_s=1.0, gpu_rank_bytes=20 * GIB)
    _heartbeat(plane, b, jid, cpu_s=2.0, gpu_rank_bytes=35 * GIB)
    progress = plane.job(jid)["progress"]
    assert (progress["gpu_rank_bytes"], progress["cpu_s"]) == (35 * GIB, 3.0)
    _heartbeat(plane, b, jid, cpu_s=2.0)  # gpu-2 could not tell this time: gpu-1's figure is the job's
    assert plane.job(jid)["progress"]["gpu_rank_bytes"] == 20 * GIB
    _heartbeat(plane, a, jid, cpu_s=1.0)
    assert "gpu_rank_bytes" not in plane.job(jid)["progress"]


class Scripted:
    """A policy that asks for ``action`` at every pass."""

    name = "scripted"
    grows = False

    def __init__(self, action: Action) -> None:
        self.action = action

    def decide(self, view: ClusterView, events: Sequence[Event], now: float) -> list[Action]:
        return [self.action] if self.action.job_id in view.jobs else []

    def next_wakeup(self, now: float) -> float | None:
        return None

    def reasons(self) -> Mapping[str, Reason]:
        return {}


def _refusals(p: Plane, jid: str) -> list[str]:
    return [e["detail"] for e in p.job(jid)["events"] if e["kind"] == "placement_refused"]


def test_the_scheduler_does_not_apply_a_resize_whose_ranks_do_not_fit(plane: Plane) -> None:
    jid, gpu = _running_on_gpus(plane, 50 * GIB)
    plane.submit(tier="premium")  # waits: the scheduler has something to decide
    one_gpu = (DeviceRef("gpu-1", 0), DeviceRef("gpu-1", 0))
    plane.rec = Reconciler(plane.db, Scripted(Action("a1", ActionKind.RESIZE, jid, one_gpu, reason="make room")))
    plane.rec.once()
    plane.rec.once()  # asked again: recorded once
    assert _refusals(plane, jid) == [
        f"the scheduler's resize from 2 to 1 device(s) is not applied: job {jid} cannot run on 1 device: its "
        f"ranks use up to 50.0 GiB of GPU memory each, and 2 of them on node gpu-1's GPU 0 ({H100}, 79.6 GiB) "
        "need 100.0 GiB"]
    _unchanged(plane, jid, gpu)
    _heartbeat(plane, gpu, jid, gpu_rank_bytes=30 * GIB)  # now they fit
    plane.rec.once()
    (act,) = gpu.actions()
    assert act["kind"] == "checkpoint"
    with plane.db.read() as s:
        row = s.get(JobRow, jid)
        assert row is not None and row.target == [["gpu-1", 0], ["gpu-1", 0]]


def test_the_scheduler_does_not_move_ranks_onto_a_gpu_they_do_not_fit(plane: Plane) -> None:
    jid, gpu = _running_on_gpus(plane, 30 * GIB)
    small = [{"index": 0, "uuid": "GPU-a0000000-0000-0000-0000-000000000000", "model": "NVIDIA A100-SXM4-40GB",
              "memory_bytes": 40 * GIB}]
    assert FakeAgent(plane, "gpu-2", "B", devices=1, gpus=small).register() == 200
    plane.submit(tier="premium")
    onto = (DeviceRef("gpu-2", 0), DeviceRef("gpu-2", 0))
    plane.rec = Reconciler(plane.db, Scripted(Action("a1", ActionKind.MIGRATE, jid, onto, reason="defragment")))
    plane.rec.once()
    assert _refusals(plane, jid) == [
        f"the scheduler's move to gpu-2 is not applied: job {jid} cannot run on 1 device: its ranks use up to "
        "30.0 GiB of GPU memory each, and 2 of them on node gpu-2's GPU 0 (NVIDIA A100-SXM4-40GB, 40.0 GiB) need "
        "60.0 GiB"]
    _unchanged(plane, jid, gpu)



@pytest.mark.parametrize(("body", "more"), [({"to": "gpu-2"}, " (and likewise on 1 other GPU(s))"),
                                            ({"to": "gpu-2", "rank": 1}, "")])
def test_a_users_move_onto_a_gpu_too_small_for_a_rank_is_refused(plane: Plane, body: dict[str, Any],
                                                                 more: str) -> None:
    jid, gpu = _running_on_gpus(plane, 50 * GIB)
    small = [{"index": i, "uuid": f"GPU-b{i}000000-0000-0000-0000-000000000000", "model": "NVIDIA A100-SXM4-40GB",
              "memory_bytes": 40 * GIB} for i in range(2)]
    assert FakeAgent(plane, "gpu-2", "B", devices=2, gpus=small).register() == 200
    r = plane.http.post(f"/v1/jobs/{jid}/migrate", headers=plane.as_user(), json=body)
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (f"job {jid} cannot run on 2 devices: its ranks use up to 50.0 GiB of GPU memory "
                                   "each, and 1 of them on node gpu-2's GPU 0 (NVIDIA A100-SXM4-40GB, 40.0 GiB) "
                                   f"needs 50.0 GiB{more}")
    assert r.json()["field"] == "to"
    _unchanged(plane, jid, gpu)


def test_show_gives_the_gpu_memory_of_the_largest_rank(plane: Plane, capsys: pytest.CaptureFixture[str]) -> None:
    from tidal.cli.jobs import _show

    jid, _ = _running_on_gpus(plane, 30 * GIB)
    _show(plane.job(jid), wide=False)
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("progress:")]
    assert "resident, 30.0 GiB of GPU memory per rank at most, " in line, line
