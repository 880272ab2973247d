"""A representative subset on PostgreSQL: the whole job life, and a control-plane kill -9 and restart."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.system.cluster import JOB, reference_run
from tidal.testing import pid_alive, wait_until

pytestmark = [pytest.mark.criu, pytest.mark.postgres]


def test_job_life_on_postgres(make_cluster, postgres_url: str, workdir: Path, gate: Path,
                              tmp_path: Path) -> None:
    # The control plane is killed and restarted below: a lease that outlasts its restart on a busy machine,
    # else the agents fence their ranks meanwhile (as they must when cut off for three quarters of it).
    c = make_cluster(nodes=2, devices=1, database_url=postgres_url, lease=20.0)
    expected_out, expected_progress = reference_run(tmp_path)
    job = c.cli("submit", "--env", "GATE", "-q", "--", "sh", "-c", JOB, cwd=workdir,
                env={"GATE": str(gate)}).stdout.strip()
    pid1 = c.wait_state(job, "running")["placement"][0]["pid"]
    wait_until(lambda: (workdir / "progress.txt").exists(), timeout=30, what="progress")
    c.cli("preempt", job)
    j = c.show(job)
    assert j["state"] == "preempted" and len(j["checkpoints"]) == 1 and not pid_alive(pid1)
    c.cli("resume", job)
    j = c.show(job)
    pid2, node2 = j["placement"][0]["pid"], j["placement"][0]["node"]
    assert j["state"] == "running" and pid2 != pid1
    c.cli("migrate", job)
    j = c.show(job)
    assert j["placement"][0]["node"] != node2 and len(j["checkpoints"]) == 2

    # the control plane dies and comes back: nothing is lost, the job kept running
    pid3 = j["placement"][0]["pid"]
    os.kill(c.state.server.pid, signal.SIGKILL)
    assert "control plane" in c.restart()
    again = c.show(job)
    assert again["placement"][0]["pid"] == pid3 and again["checkpoints"] == j["checkpoints"]
    assert [e["id"] for e in again["events"]][: len(j["events"])] == [e["id"] for e in j["events"]]

    gate.touch()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress
    # the state really is in PostgreSQL, not in a stray SQLite file
    assert not (c.home / "tidal.db").exists()


def test_checkpoint_state_migration_on_postgres(postgres_url: str) -> None:
    from tests.integration.control.test_checkpoints import upgrade_from_0003

    upgrade_from_0003(postgres_url)
