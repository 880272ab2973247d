"""A job whose disjoint sub-groups, 2-D mesh and point-to-point operations cross nodes, on the live cluster:
its ranks span two nodes, so every checkpoint goes through the control plane's steps (counts per
communicator, park rounds, dump, finish). It is checkpointed periodically while it runs, preempted and
resumed, has a rank migrated to a third node, and every rank's step lines equal plain ``torchrun``'s."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.system.cluster import free_port, rank_lines
from tidal.testing import wait_until
from tidal.testing.torchrun import TorchRun

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[1] / "integration" / "mechanisms" / "interpose" / "scripts" / "dist_groups.py"
ENV = {"OMP_NUM_THREADS": "1"}
WORLD, STEPS, HELD = 4, 150, 140


@pytest.mark.timeout(900)
def test_subgroups_and_p2p_across_nodes_checkpointed_preempted_migrated_identical(make_cluster,
                                                                                  tmp_path: Path) -> None:
    gate, opened = tmp_path / "gate", tmp_path / "open"
    opened.touch()

    def args(g: Path) -> list[str]:
        return ["--steps", str(STEPS), "--step-time", "0.1", "--gate", f"{g}:{HELD}"]

    ref = tmp_path / "ref"
    ref.mkdir()
    torchrun = TorchRun([str(SCRIPT), *args(opened)], nproc=WORLD, cwd=ref, logs=ref / "logs",
                        env={**os.environ, **ENV}, options=["--master-port", str(free_port())])

    c = make_cluster(nodes=3, devices=2)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--name", "groups", "--ranks", str(WORLD), "--checkpoint-every", "4s", "--",
                sys.executable, str(SCRIPT), *args(gate), cwd=work, env=ENV).stdout.strip()
    j = c.wait_state(job, "running", timeout=120)
    nodes = [p["node"] for p in sorted(j["placement"], key=lambda p: p["rank"])]
    # Ranks 0, 1 on one node and 2, 3 on another: [0, 2], [1, 3] and the ring of sends cross them.
    assert len(set(nodes)) == 2 and nodes[0] == nodes[1] and nodes[2] == nodes[3], nodes

    def steps() -> int:
        return len(rank_lines(c.cli("logs", job, "--rank", "0").stdout))

    # Periodic checkpoints, each a part per node, while the job goes on (the same attempt).
    wait_until(lambda: len([k for k in c.job(job)["checkpoints"] if len(k["parts"]) == 2]) >= 2, timeout=180,
               what="two periodic checkpoints over both nodes")
    assert c.job(job)["attempt"] == j["attempt"] and steps() < HELD
    c.cli("preempt", job, timeout=300)
    assert c.job(job)["state"] == "preempted"
    c.cli("resume", job, timeout=300)
    c.wait_state(job, "running", timeout=300)
    here = {p["node"] for p in c.job(job)["placement"]}
    (free,) = {"node-1", "node-2", "node-3"} - here
    c.cli("migrate", job, "--rank", "2", "--to", free, timeout=300)
    j = c.wait_state(job, "running", timeout=300)
    assert {p["rank"]: p["node"] for p in j["placement"]}[2] == free
    assert steps() < HELD, "the job reached its gate before the operations: slow it down"
    gate.touch()
    assert c.cli("wait", job, check=False, timeout=600).returncode == 0, c.cli("show", job).stdout
    torchrun.wait(600)
    events = [e["detail"] for e in c.show(job)["events"]]
    assert not [e for e in events if "checkpoint failed" in e], events
    for r in range(WORLD):
        assert rank_lines(c.cli("logs", job, "--rank", str(r)).stdout) == rank_lines(torchrun.stdout(r)), r
