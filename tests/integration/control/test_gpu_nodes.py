"""GPU nodes on a real control plane (API, SQLite database), registered by scripted agents: what the
control plane keeps of each device's GPU and shows in the API's node view, with the jobs on each device. No
GPU is involved: the GPUs are what a scripted agent says it found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import select

from tests.integration.control.store.revisions import columns, to
from tidal.control.store.db import Database
from tidal.control.store.models import EventRow, NodeRow
from tidal.testing.control import FakeAgent, Plane

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
