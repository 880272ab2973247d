"""The whole life of a job on a real cluster: submit → preempt → resume → migrate → complete, with output
byte-identical to an uninterrupted run, new pids and nodes at each step, and a growing checkpoint count."""

from __future__ import annotations

import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.cluster import JOB, reference_run
from tidal.testing import owned_dir, pid_alive, wait_until

pytestmark = pytest.mark.criu


# Most users are not root: the same life for a job of an ordinary account (its ranks run as "nobody").
@pytest.mark.parametrize("account", ["root", "nobody"])
def test_submit_preempt_resume_migrate_complete(make_cluster, workdir: Path, gate: Path, tmp_path: Path,
                                                shared_tmp: Path, account: str) -> None:
    c = make_cluster(nodes=2, devices=1)
    expected_out, expected_progress = reference_run(tmp_path)
    env = {"GATE": str(gate)}
    if account != "root":
        workdir = owned_dir(shared_tmp / "work", account)
        gate = shared_tmp / "gate"
        env["GATE"] = str(gate)
        c.become(account)

    job = c.cli("submit", "--env", "GATE", "--quiet", "--name", "steps", "--", "sh", "-c", JOB, cwd=workdir,
                env=env).stdout.strip()
    follow = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "logs", "-f", job], env=c.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    j = c.wait_state(job, "running")
    pid1, node1 = j["placement"][0]["pid"], j["placement"][0]["node"]
    progress = workdir / "progress.txt"
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 10, timeout=30, what="progress")

    # the agent reports what it sees of the running rank
    prog = wait_until(lambda: c.job(job)["progress"], timeout=30, what="progress reported by the agent")
    assert prog["rss_bytes"] > 0 and prog["output_bytes"] >= 0

    # preempt: checkpoint, release the device, hold
    c.cli("preempt", job)
    j = c.show(job)
    assert j["state"] == "preempted" and j["held"] is True
    assert j["placement"] == []
    assert len(j["checkpoints"]) == 1
    assert not pid_alive(pid1)
    assert {"id", "created_at", "bytes"} <= set(j["checkpoints"][0])
    assert j["checkpoints"][0]["bytes"] > 0

    # a held job is not resumed automatically, even with free devices: it still waits after a filler job
    # takes one node (so that the resume must land on the other one)
    filler = c.cli("submit", "-q", "--", "sleep", "600", cwd=workdir).stdout.strip()
    f = c.wait_state(filler, "running")
    assert c.job(job)["state"] == "preempted"

    c.cli("resume", job)
    j = c.show(job)
    assert j["state"] == "running"
    pid2, node2 = j["placement"][0]["pid"], j["placement"][0]["node"]
    assert pid2 != pid1 and pid_alive(pid2)
    assert node2 != f["placement"][0]["node"]

    # migrate (no --to: any other node with room) after the filler leaves
    c.cli("cancel", filler)
    c.wait_state(filler, "cancelled")
    wait_until(lambda: any(n["free"] for n in c.api().get("/v1/nodes").json() if n["name"] != node2), timeout=30,
               what="a free device on the other node")
    out = c.cli("migrate", job).stdout
    j = c.show(job)
    assert j["state"] == "running", out
    pid3, node3 = j["placement"][0]["pid"], j["placement"][0]["node"]
    assert node3 != node2 and pid3 not in (pid1, pid2)
    assert not pid_alive(pid2)
    assert len(j["checkpoints"]) == 2

    gate.touch()
    done = c.cli("wait", job, check=False)
    assert done.returncode == 0, done.stderr
    logs = c.cli("logs", job)
    assert logs.stdout.encode() == expected_out
    followed, _ = follow.communicate(timeout=30)  # `logs -f` saw it all live, across every move
    assert followed == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress
    owner = pwd.getpwnam(account)
    st = (workdir / "progress.txt").stat()
    assert (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid)  # restored as the job's own file

    j = c.show(job)
    assert j["state"] == "succeeded" and j["exit_code"] == 0
    kinds = [e["kind"] for e in j["events"]]
    for k in ("submitted", "running", "checkpointing", "preempted", "released", "restoring", "migrating",
              "succeeded"):
        assert k in kinds, kinds
    assert all(e["cause"] for e in j["events"])
    assert {"time", "kind", "cause"} <= set(j["events"][0])
    assert node1  # placed somewhere at first


def test_wait_exits_with_the_job_exit_code(make_cluster, workdir: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    job = c.cli("submit", "-q", "--", "sh", "-c", "echo out; echo err >&2; exit 7",
                cwd=workdir).stdout.strip()
    p = c.cli("wait", job, check=False)
    assert p.returncode == 7
    assert c.cli("logs", job).stdout == "out\nerr\n"
    assert c.show(job)["state"] == "failed"


def test_down_leaves_no_images_in_memory(make_cluster, workdir: Path) -> None:
    """A job's agent keeps its last dump in /dev/shm for the next checkpoint. `tidal down` removes what
    the agents kept there, also for an agent that was killed and could not clean up itself."""
    import hashlib
    import os
    import signal

    from tidal.control.clusterfile import load
    from tidal.control.localcluster import down
    from tidal.mechanisms.criu.rank import FAST_STAGING

    c = make_cluster(nodes=1, devices=1)
    job = c.cli("submit", "-q", "--checkpoint-every", "1s", "--", "sh", "-c", JOB, cwd=workdir).stdout.strip()
    wait_until(lambda: len(c.job(job)["checkpoints"]) >= 2, timeout=60, what="two periodic checkpoints")
    digest = hashlib.sha256(str((c.home / "nodes" / "node-1").resolve()).encode()).hexdigest()[:12]

    def kept() -> list[Path]:
        return [p for p in (FAST_STAGING / "tidal").glob(f"*-{digest}") if any(p.iterdir())]

    assert kept(), "the agent kept no images in memory: nothing to check"
    agent = load(c.home).agents["node-1"].pid  # type: ignore[union-attr]
    os.kill(agent, signal.SIGKILL)
    wait_until(lambda: not pid_alive(agent), timeout=30, what="the agent to die")
    assert kept(), "the killed agent removed its images after all: nothing to check"
    down(c.settings)
    assert not [p for area in ("tidal", "tidal-fetched") for p in (FAST_STAGING / area).glob(f"*-{digest}")]
