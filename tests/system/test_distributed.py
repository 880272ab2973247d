"""Distributed (DDP, gloo) jobs on the live cluster: their ranks are spread over nodes, checkpointed at a
consistent cut at random moments, migrated (all ranks, or one), preempted and resumed, and recovered after
an agent is killed; every rank's per-step output and the final parameters are byte-identical to the same
script under plain ``torchrun``."""

from __future__ import annotations

import json
import os
import pwd
import random
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.system.cluster import LiveCluster
from tests.system.cluster import free_port as _free_port
from tidal.testing import owned_dir, pid_alive, wait_until
from tidal.testing.torchrun import torchrun as plain_torchrun

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
DDP = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
ENV = {"OMP_NUM_THREADS": "1"}  # the same math as the reference, whatever a device's cores


def torchrun(tmp_path: Path, world: int, args: list[str]) -> tuple[dict[int, list[str]], bytes]:
    """Each rank's step lines and the final parameters under plain torchrun on one machine."""
    ref = tmp_path / "torchrun"
    ref.mkdir()
    run = plain_torchrun([str(DDP), *args], nproc=world, cwd=ref, env={**os.environ, **ENV},
                         options=["--master-addr", "127.0.0.1", "--master-port", str(_free_port())])
    return {r: _steps(run.stdout(r)) for r in range(world)}, (ref / "params.bin").read_bytes()


def gated(tmp_path: Path, world: int, steps: int, held: int, *extra: str,
          step_time: str = "0.01") -> tuple[Path, list[str], dict[int, list[str]], bytes]:
    """The DDP script's arguments, held from step ``held`` until the test creates the gate, and what plain
    torchrun makes of them (run with the gate open)."""
    gate = tmp_path / "gate"
    args = ["--steps", str(steps), "--step-time", step_time, *extra, "--gate", f"{gate}:{held}"]
    gate.touch()
    expected, params = torchrun(tmp_path, world, args)
    gate.unlink()
    return gate, args, expected, params


def _steps(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("rank ")]


def _rank_lines(c: LiveCluster, job: str, world: int) -> dict[int, list[str]]:
    return {r: _steps(c.cli("logs", job, "--rank", str(r)).stdout) for r in range(world)}


def _nodes(j: dict[str, Any]) -> list[str]:
    return [p["node"] for p in sorted(j["placement"], key=lambda p: p["rank"])]


def _user_pid(init_pid: int) -> int:
    """The rank's command: the child of its init."""
    children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
    return int(children[0])


def _steps_done(c: LiveCluster, job: str) -> int:
    return len(_steps(c.cli("logs", job, "--rank", "0").stdout))


@pytest.mark.timeout(1200)
def test_ddp_w4_random_checkpoints_migrations_and_agent_kill(make_cluster, tmp_path: Path) -> None:
    world, held = 4, 295
    gate, args, expected, params = gated(tmp_path, world, 300, held, "--collectives")

    c = make_cluster(nodes=4, devices=2)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--name", "ddp", "--ranks", str(world), "--", sys.executable, str(DDP), *args,
                cwd=work, env=ENV).stdout.strip()
    j = c.wait_state(job, "running", timeout=120)
    # Larger than any node (2 devices): filled onto two nodes, contiguous ranks together.
    nodes = _nodes(j)
    assert len(set(nodes)) == 2 and nodes[0] == nodes[1] and nodes[2] == nodes[3], nodes
    wait_until(lambda: _steps_done(c, job) >= 3, timeout=120, what="first steps")

    rng = random.Random(20261122)
    done = 0
    for _ in range(14):
        before = c.job(job)
        op = rng.choice(["migrate", "rank", "preempt"])
        if op == "migrate":
            c.cli("migrate", job, timeout=300)
        elif op == "rank":
            r = rng.randrange(world)
            here = _nodes(before)[r]
            to = rng.choice([n for n in ("node-1", "node-2", "node-3", "node-4") if n != here])
            free = c.cli("migrate", job, "--rank", str(r), "--to", to, check=False, timeout=300)
            if free.returncode != 0:  # the node is full: a clear refusal, nothing happened
                assert "has no free device" in free.stderr, free.stderr
                assert c.job(job)["attempt"] == before["attempt"]
                continue
            assert _nodes(c.job(job))[r] == to
        else:
            c.cli("preempt", job, timeout=300)
            assert c.job(job)["state"] == "preempted"
            c.cli("resume", job, timeout=300)
        after = c.wait_state(job, "running", timeout=300)
        assert after["attempt"] == before["attempt"] + 1, (op, after["events"][-3:])
        assert len({(p["node"], p["device"]) for p in after["placement"]}) == world
        done += 1
        # Let it run a moment, at a random point of its step: between 0 and 2 more steps.
        target = min(held, _steps_done(c, job) + rng.randrange(3))
        wait_until(lambda t=target: _steps_done(c, job) >= t, timeout=120, what="steps after the request")
    assert done >= 10

    # Kill the agent of rank 0's node: its ranks die with it (their lifeline), the other node's ranks
    # fail at their next collective; the job comes back from its last committed checkpoint.
    j = c.job(job)
    node0 = _nodes(j)[0]
    os.kill(c.state.agents[node0].pid, signal.SIGKILL)
    pids = [p["pid"] for p in j["placement"]]
    wait_until(lambda: any(f"node {node0} lost" in e["detail"] for e in c.job(job)["events"]), timeout=120,
               what="the job to be requeued")
    c.restart()  # the node's agent comes back (as `tidal up` would start it)
    j = c.wait_state(job, "running", timeout=300)
    assert all(not pid_alive(p) for p in pids)
    with c.api("admin") as api:
        down = [e for e in api.get("/v1/events", params={"last": 1000}).json() if e["kind"] == "node_down"]
    assert [e["node"] for e in down] == [node0]
    # Requeued without spending a restart: the job lost a node, nothing of its own failed.
    assert j["restarts"] == 0
    assert any(f"node {node0} lost" in e["detail"] and "not counted as a restart" in e["detail"]
               for e in j["events"]), j["events"][-5:]

    gate.touch()
    assert c.cli("wait", job, check=False, timeout=600).returncode == 0
    j = c.show(job)
    assert j["state"] == "succeeded"
    assert _rank_lines(c, job, world) == expected
    assert (work / "params.bin").read_bytes() == params
    assert len(j["checkpoints"]) >= 1
    evs = [e["kind"] for e in j["events"]]
    assert evs.count("migrating") >= 1 and "preempted" in evs


@pytest.mark.timeout(900)
def test_ddp_w2_operations_and_faults(make_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_CUT_TIMEOUT", "4")  # a stopped rank is given up on quickly
    world = 2
    gate, args, expected, params = gated(tmp_path, world, 40, 35, step_time="0.02")

    c = make_cluster(nodes=4, devices=1)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--ranks", str(world), "--", sys.executable, str(DDP), *args, cwd=work,
                env=ENV).stdout.strip()
    j = c.wait_state(job, "running", timeout=120)
    assert len(set(_nodes(j))) == 2
    wait_until(lambda: _steps_done(c, job) >= 3, timeout=120, what="first steps")

    # Progress from the interposer, for the scheduler and `tidal show`: steps, collectives, their rates.
    def progress() -> dict[str, Any] | None:
        p = c.job(job).get("progress") or {}
        return p if p.get("steps", 0) >= 1 and "collectives_per_s" in p else None

    prog = wait_until(progress, timeout=60, what="progress from the interposer")
    assert prog["collectives"] > prog["steps"] and prog["steps_per_s"] >= 0
    assert "steps (" in c.cli("show", job).stdout

    c.cli("migrate", job, "--rank", "1", "--to", "node-3", timeout=300)
    assert _nodes(c.wait_state(job, "running"))[1] == "node-3"
    c.cli("preempt", job, timeout=300)
    c.cli("resume", job, timeout=300)
    c.cli("migrate", job, timeout=300)
    j = c.wait_state(job, "running")
    show = c.cli("show", job).stdout
    assert "rank" in show and "node" in show
    assert len(j["checkpoints"]) >= 3

    # A checkpoint request while a rank is stopped: a clear error, the last checkpoint stays, the job goes on.
    kept = [ck["id"] for ck in j["checkpoints"]]
    stopped = _user_pid(j["placement"][1]["pid"])
    os.kill(stopped, signal.SIGSTOP)
    try:
        p = c.cli("preempt", job, check=False, timeout=300)
        assert p.returncode != 0
        assert "could not be preempted" in p.stderr and "in time; is it stopped?" in p.stderr, p.stderr
        j = c.job(job)
        assert j["state"] == "running" and [ck["id"] for ck in j["checkpoints"]] == kept
    finally:
        os.kill(stopped, signal.SIGCONT)

    # It goes on from where it was (no restart): the same attempt runs to the end.
    gate.touch()
    assert c.cli("wait", job, check=False, timeout=600).returncode == 0
    assert c.job(job)["attempt"] == j["attempt"]
    assert _rank_lines(c, job, world) == expected
    assert (work / "params.bin").read_bytes() == params


def test_failing_rank_is_the_root_cause_and_the_others_are_stopped(make_cluster, tmp_path: Path) -> None:
    c = make_cluster(nodes=2, devices=2)
    work = tmp_path / "work"
    work.mkdir()
    # Rank 3 (on the second node) fails; ranks 0-2 would fail at their next collective or hang.
    job = c.cli("submit", "-q", "--ranks", "4", "--", sys.executable, str(DDP), "--steps", "200", "--step-time",
                "0.02", "--fail", "3:5:3", cwd=work, env=ENV).stdout.strip()
    j = c.wait_state(job, "failed", timeout=300)
    assert j["exit_code"] == 3
    assert j["error"].startswith("rank 3 exited with code 3 (root cause)"), j["error"]
    assert "rank 3 fails on purpose" in c.cli("logs", job, "--rank", "3").stdout
    assert "root cause" in c.cli("show", job).stdout
    # No rank is left hanging: every process the job started is gone.
    started = next(e for e in j["events"] if e["kind"] == "started")
    pids = json.loads(started["detail"].removeprefix("pids "))
    assert len(pids) == 4 and not any(pid_alive(p) for p in pids)


def _python_for(account: str, checkout: Path) -> list[str] | None:
    """How a job of ``account`` runs this test environment's Python: this interpreter may sit where other
    accounts cannot go (a private pyenv), so the system's one of the same version, with this environment's
    packages on PYTHONPATH. None where the account cannot read them."""
    exe = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    site = Path(sysconfig.get_paths()["purelib"])
    probe = f"PYTHONPATH={site}:{checkout / 'src'} {exe} -c 'import torch, tidal'"
    ok = subprocess.run(["su", account, "-s", "/bin/sh", "-c", probe], capture_output=True, check=False)
    return [str(exe), f"PYTHONPATH={site}:{checkout / 'src'}"] if exe.exists() and ok.returncode == 0 else None


def test_ddp_job_of_an_ordinary_account_preempted_migrated_resized_is_bit_identical(
        make_cluster, tmp_path: Path, shared_tmp: Path) -> None:
    # Most users are not root: a W = 2 DDP job of "nobody" is preempted and resumed, has a rank moved to
    # another node, is shrunk to one device and grown back, and ends identical to plain torchrun.
    checkout = Path(__file__).resolve().parents[2]
    how = _python_for("nobody", checkout)
    if how is None:
        pytest.skip(f"the account nobody cannot read this checkout ({checkout}) or its Python environment, "
                    "so no job of it can run this test's script")
    exe, pythonpath = how
    world, held = 2, 75
    script = shared_tmp / "ddp_train.py"
    script.write_bytes(DDP.read_bytes())
    script.chmod(0o644)
    gate = shared_tmp / "gate"
    args = ["--steps", "80", "--step-time", "0.05", "--collectives", "--gate", f"{gate}:{held}"]
    gate.touch()
    expected, params = torchrun(tmp_path, world, [*args])
    gate.unlink()

    c = make_cluster(nodes=2, devices=2)
    work = owned_dir(shared_tmp / "work", "nobody")
    c.become("nobody")
    job = c.cli("submit", "-q", "--ranks", str(world), "--min-devices", "1", "--env", pythonpath,
                "--env", "OMP_NUM_THREADS=1", "--", exe, str(script), *args, cwd=work).stdout.strip()
    j = c.wait_state(job, "running", timeout=120)
    assert all(Path(f"/proc/{_user_pid(p['pid'])}").stat().st_uid == pwd.getpwnam("nobody").pw_uid
               for p in j["placement"])
    wait_until(lambda: _steps_done(c, job) >= 3, timeout=120, what="first steps")

    c.cli("preempt", job)
    assert c.job(job)["state"] == "preempted"
    c.cli("resume", job)
    j = c.wait_state(job, "running")
    n = _steps_done(c, job)
    wait_until(lambda: _steps_done(c, job) >= min(held, n + 2), timeout=120, what="steps after the resume")
    here = _nodes(j)
    other = next(x["name"] for x in c.api().get("/v1/nodes").json() if x["name"] != here[1])
    c.cli("migrate", job, "--rank", "1", "--to", other)
    assert _nodes(c.wait_state(job, "running"))[1] == other
    c.cli("resize", job, "--devices", "1", timeout=300)
    assert c.wait_state(job, "running")["devices"] == 1
    c.cli("resize", job, "--devices", "2", timeout=300)
    assert c.wait_state(job, "running")["devices"] == 2

    gate.touch()
    assert c.cli("wait", job, check=False, timeout=600).returncode == 0
    assert _rank_lines(c, job, world) == expected
    assert (work / "params.bin").read_bytes() == params
    assert (work / "params.bin").stat().st_uid == pwd.getpwnam("nobody").pw_uid
