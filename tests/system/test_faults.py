"""Scheduling and faults on a real cluster: premium preempts basic, periodic checkpoints, an agent killed
with SIGKILL (its ranks fenced, its jobs restored elsewhere only after its lease expired), a rank killed
from outside, and the control plane killed and restarted."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.system.cluster import JOB, reference_run
from tidal.testing import pid_alive, wait_until

pytestmark = pytest.mark.criu


def _progress(workdir: Path) -> int:
    p = workdir / "progress.txt"
    return len(p.read_text().split()) if p.exists() else 0


def test_premium_preempts_basic_which_resumes_by_itself(make_cluster, workdir: Path, gate: Path,
                                                        tmp_path: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    expected_out, expected_progress = reference_run(tmp_path)
    basic = c.cli("submit", "--env", "GATE", "-q", "--tier", "basic", "--", "sh", "-c", JOB, cwd=workdir,
                  env={"GATE": str(gate)}).stdout.strip()
    pid1 = c.wait_state(basic, "running")["placement"][0]["pid"]
    wait_until(lambda: _progress(workdir) >= 5, timeout=30, what="progress")

    other = tmp_path / "premium"
    other.mkdir()
    premium = c.cli("submit", "-q", "--tier", "premium", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; "
                    "done; echo premium done", cwd=other).stdout.strip()
    p = c.wait_state(premium, "running")
    b = c.job(basic)
    assert b["state"] == "preempted" and b["held"] is False
    assert not pid_alive(pid1)
    preempted = [e for e in b["events"] if e["kind"] == "checkpointing"][-1]
    assert preempted["cause"].startswith("singularity-")
    assert p["placement"][0]["node"] == "node-1"

    gate.touch()  # the premium job finishes; the basic one resumes on its own and completes
    assert c.cli("wait", premium, check=False).returncode == 0
    assert c.cli("wait", basic, check=False).returncode == 0
    assert c.cli("logs", basic).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress
    assert c.cli("logs", premium).stdout == "premium done\n"


def test_agent_sigkill_fences_ranks_and_restores_after_lease(make_cluster, workdir: Path, gate: Path,
                                                            tmp_path: Path) -> None:
    lease = 2.0
    c = make_cluster(nodes=2, devices=1, lease=lease)
    expected_out, expected_progress = reference_run(tmp_path)
    job = c.cli("submit", "--env", "GATE", "-q", "--checkpoint-every", "1s", "--max-restarts", "2", "--", "sh", "-c",
                JOB, cwd=workdir, env={"GATE": str(gate)}).stdout.strip()
    j = c.wait_state(job, "running")
    node, pid = j["placement"][0]["node"], j["placement"][0]["pid"]
    wait_until(lambda: len(c.job(job)["checkpoints"]) >= 1, timeout=30, what="a periodic checkpoint")
    c.wait_state(job, "running")

    agent_pid = c.state.agents[node].pid
    os.kill(agent_pid, signal.SIGKILL)
    killed_at = time.time()
    wait_until(lambda: not pid_alive(pid), timeout=10, what="the rank to die with its agent (fencing)")

    wait_until(lambda: any(f"node {node} lost" in e["detail"] for e in c.job(job)["events"]), timeout=30,
               what="the job to be requeued")
    j = c.wait_state(job, "running", timeout=30)
    assert j["placement"][0]["node"] != node
    assert j["restarts"] == 0  # its node was lost: that spends none of its restarts
    lost = [e for e in j["events"] if e["kind"] == "pending" or e["kind"] == "preempted"][-1]
    assert lost["time"] >= killed_at + lease - 0.5, "rescheduled before the lease expired"
    assert lost["detail"].startswith(f"node {node} lost (lease expired); ") and \
        lost["detail"].endswith(", not counted as a restart (0/2 used)"), lost

    # the node comes back with a new agent once `tidal up` restarts it
    assert node in c.restart()
    wait_until(lambda: any(n["name"] == node and n["up"] for n in c.api().get("/v1/nodes").json()), timeout=30,
               what="the node to come back")

    gate.touch()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress


def test_rank_killed_from_outside_is_restored(make_cluster, workdir: Path, gate: Path, tmp_path: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    expected_out, expected_progress = reference_run(tmp_path)
    job = c.cli("submit", "--env", "GATE", "-q", "--checkpoint-every", "1s", "--", "sh", "-c", JOB, cwd=workdir,
                env={"GATE": str(gate)}).stdout.strip()
    wait_until(lambda: len(c.job(job)["checkpoints"]) >= 1, timeout=30, what="a periodic checkpoint")
    init = c.wait_state(job, "running")["placement"][0]["pid"]
    # the user's command is the init's child
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)
    wait_until(lambda: c.job(job)["restarts"] == 1, timeout=30, what="the restart")
    j = c.wait_state(job, "running")
    assert j["placement"][0]["pid"] != init
    gate.touch()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress


def test_control_plane_kill9_and_restart_loses_nothing(make_cluster, workdir: Path, gate: Path,
                                                       tmp_path: Path) -> None:
    # Agents fence their ranks when the control plane is away for three quarters of the lease (they cannot
    # tell that from a partition). The control plane is away here for a CLI run and its own restart, which
    # on a busy machine can take longer than the default 3 s lease allows: a lease of 20 s keeps the
    # restart within it, as a production lease must (docs/deploy.md, Leases).
    c = make_cluster(nodes=2, devices=1, lease=20.0)
    expected_out, expected_progress = reference_run(tmp_path)
    job = c.cli("submit", "--env", "GATE", "-q", "--", "sh", "-c", JOB, cwd=workdir,
                env={"GATE": str(gate)}).stdout.strip()
    pid = c.wait_state(job, "running")["placement"][0]["pid"]
    c.cli("migrate", job)
    before = c.show(job)
    pid = before["placement"][0]["pid"]
    with c.api("admin") as api:
        events_before = [e["id"] for e in api.get("/v1/events").json()]

    os.kill(c.state.server.pid, signal.SIGKILL)
    seen = _progress(workdir)
    wait_until(lambda: _progress(workdir) > seen or _progress(workdir) >= 80, timeout=30, what="the job to go on")
    assert pid_alive(pid)
    assert c.cli("ls", check=False).returncode != 0  # nobody answers meanwhile

    assert "control plane" in c.restart()
    after = c.show(job)
    assert after["state"] == "running" and after["placement"][0]["pid"] == pid
    assert after["checkpoints"] == before["checkpoints"]
    assert [e["id"] for e in after["events"]][: len(before["events"])] == [e["id"] for e in before["events"]]
    with c.api("admin") as api:
        events_after = [e["id"] for e in api.get("/v1/events").json()]
    assert events_after[: len(events_before)] == events_before  # the whole log, cluster events included
    assert "control_plane_started" in c.cli("events", env={"TIDAL_TOKEN": c.token("admin")}).stdout
    # the agents reconnected: the job can still be moved
    c.cli("migrate", job)
    assert c.show(job)["placement"][0]["node"] != after["placement"][0]["node"]
    gate.touch()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress
