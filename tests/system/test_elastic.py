"""Elastic resize by replica splicing: a job's W ranks run on any D devices; resizing it (a consistent cut,
a checkpoint of every rank, a restore with the new packing) leaves its results byte-identical to plain
``torchrun`` with W processes."""

from __future__ import annotations

import pwd
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.system.cluster import JOB, LiveCluster, reference_run
from tests.system.test_distributed import DDP, ENV, _rank_lines, _steps_done, gated
from tests.system.test_prestaged_migration import restores
from tidal.testing import owned_dir, wait_until


def _devices(j: dict[str, Any]) -> list[tuple[str, int]]:
    return [(p["node"], p["device"]) for p in sorted(j["placement"], key=lambda p: p["rank"])]


def _affinity(pid: int) -> str:
    text = Path(f"/proc/{pid}/status").read_text()
    return next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Cpus_allowed_list"))


@pytest.mark.criu
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ddp_w4_resized_4_2_1_4_across_nodes_is_bit_identical(make_cluster, tmp_path: Path) -> None:
    world, held = 4, 115
    gate, args, expected, params = gated(tmp_path, world, 120, held, "--collectives")

    c = make_cluster(nodes=2, devices=2)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--ranks", "4", "--min-devices", "1", "--", sys.executable, str(DDP), *args,
                cwd=work, env=ENV).stdout.strip()
    j = c.wait_state(job, "running", timeout=120)
    assert len(set(_devices(j))) == 4 and len({n for n, _ in _devices(j)}) == 2
    wait_until(lambda: _steps_done(c, job) >= 3, timeout=120, what="first steps")

    cpus = {n["name"]: n["cpus"] for n in c.api().get("/v1/nodes").json()}
    seen = [4]
    for d in (2, 1, 4):
        n = _steps_done(c, job)
        out = c.cli("resize", job, "--devices", str(d), timeout=300).stdout
        assert f"on {d} device(s)" in out, (out, [e["detail"] for e in c.job(job)["events"][-6:]])
        j = c.wait_state(job, "running")
        devs = _devices(j)
        assert len(set(devs)) == d and j["devices"] == d and j["pinned_devices"] == d
        # Contiguous ranks share a device, evenly; sharing ranks share its CPU set.
        assert devs == [sorted(set(devs))[r * d // world] for r in range(world)]
        for p in j["placement"]:
            child = int(Path(f"/proc/{p['pid']}/task/{p['pid']}/children").read_text().split()[0])
            want = cpus[p["node"]][p["device"]]
            assert _affinity(child) == (f"{want[0]}-{want[-1]}" if len(want) > 1 else str(want[0]))
        seen.append(d)
        wait_until(lambda n=n: _steps_done(c, job) >= min(held, n + 2), timeout=120, what="steps after a resize")
    assert seen == [4, 2, 1, 4]
    j = c.show(job)
    resizes = [e for e in j["events"] if e["kind"] == "resize"]
    assert [e["detail"].split(",")[0] for e in resizes] == ["from 4 to 2 device(s)", "from 2 to 1 device(s)",
                                                            "from 1 to 4 device(s)"]
    assert len(j["checkpoints"]) == 3
    # 2 → 1 within one node: answered once dumped, the job restored from those images while they were
    # committed; the checkpoint counts once committed.
    second, third = (next(ck["id"] for ck in j["checkpoints"] if ck["id"].startswith(f"00000{i}-")) for i in (2, 3))
    logs = "".join((c.home / "logs" / f"{n}.log").read_text(errors="replace") for n in sorted(cpus))
    assert f"job {job} restored from the images of checkpoint {second} dumped here" in logs
    wait_until(lambda: any(e["kind"] == "committed" and second in e["detail"] for e in c.show(job)["events"]),
               timeout=60, what=f"checkpoint {second} reported committed")
    # 1 → 4 over both nodes: the ranks that stayed were restored from the images their node kept (the other
    # node's were prestaged from the checkpoint before, and fetched what changed since).
    ((_, fetched, total, _),) = [r for n in sorted(cpus) for r in restores(c, n, job)
                                 if r[0] == third and r[3] == f"prestaged from checkpoint {third}"]
    assert fetched < 0.02 * total, (fetched, total)
    show = c.cli("show", job).stdout
    assert "ranks: 4 on 4 device(s) (pinned by resize)" in show

    gate.touch()
    assert c.cli("wait", job, check=False, timeout=600).returncode == 0
    assert _rank_lines(c, job, world) == expected
    assert (work / "params.bin").read_bytes() == params


@pytest.mark.criu
def test_resize_bad_input(make_cluster, tmp_path: Path, workdir: Path, gate: Path) -> None:
    c: LiveCluster = make_cluster(nodes=1, devices=2)
    env = {"GATE": str(gate)}
    job = c.cli("submit", "--env", "GATE", "-q", "--ranks", "2", "--min-devices", "1", "--", "sh", "-c", JOB,
                cwd=workdir, env=env).stdout.strip()
    c.wait_state(job, "running")
    for d, msg in (("0", "--devices must be at least 1, not 0"),
                   ("3", f"job {job} has 2 rank(s): it cannot use 3 devices")):
        p = c.cli("resize", job, "--devices", d, check=False)
        assert p.returncode != 0 and msg in p.stderr, p.stderr
    assert c.cli("resize", job, check=False).returncode != 0  # neither --devices nor --auto

    # Shrink to one device: the freed one takes another job; growing back then finds no room.
    c.cli("resize", job, "--devices", "1")
    assert c.job(job)["devices"] == 1
    other = c.cli("submit", "--env", "GATE", "-q", "--", "sh", "-c", JOB, cwd=workdir, env=env).stdout.strip()
    c.wait_state(other, "running")
    p = c.cli("resize", job, "--devices", "2", check=False)
    assert p.returncode != 0 and f"there is no room for job {job} on 2 devices" in p.stderr, p.stderr
    j = c.job(job)
    assert j["state"] == "running" and j["devices"] == 1 and not j["busy"]

    # Bounds from submission; pending and finished jobs.
    rigid = c.cli("submit", "--env", "GATE", "-q", "--ranks", "2", "--min-devices", "2", "--", "sh", "-c", JOB,
                  cwd=workdir, env=env).stdout.strip()
    p = c.cli("resize", rigid, "--devices", "1", check=False)
    assert p.returncode != 0 and f"job {rigid} may run on 2..2 devices, not 1" in p.stderr, p.stderr
    c.cli("cancel", rigid)
    p = c.cli("resize", rigid, "--devices", "2", check=False)
    assert p.returncode != 0 and f"job {rigid} has already cancelled" in p.stderr, p.stderr
    pending = c.cli("submit", "--env", "GATE", "-q", "--ranks", "2", "--min-devices", "1", "--", "sh", "-c", JOB,
                    cwd=workdir, env=env).stdout.strip()
    p = c.cli("resize", pending, "--devices", "1", check=False)
    assert p.returncode != 0 and "is not running (it is pending)" in p.stderr, p.stderr
    out = c.cli("resize", job, "--auto").stdout
    assert "resized by the scheduler again" in out and c.job(job)["pinned_devices"] is None
    gate.touch()
    for j in (job, other):
        assert c.cli("wait", j, check=False, timeout=300).returncode == 0


@pytest.mark.criu
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_scheduler_shrinks_for_premium_and_grows_back_bit_identical(make_cluster, tmp_path: Path) -> None:
    world = 4
    gate, args, expected, params = gated(tmp_path, world, 200, 195, "--collectives")

    # One node of four devices: the policy shrinks a job by the devices it holds on the node where room is
    # needed (a job spread over nodes is preempted instead).
    c = make_cluster(nodes=1, devices=4, policy="singularity")
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--ranks", "4", "--min-devices", "2", "--", sys.executable, str(DDP), *args,
                cwd=work, env=ENV).stdout.strip()
    assert c.wait_state(job, "running", timeout=120)["devices"] == 4
    wait_until(lambda: _steps_done(c, job) >= 3, timeout=120, what="first steps")
    # The live policy protects a job for 5 s after it (re)started against being resized or preempted.
    wait_until(lambda: time.time() - c.job(job)["started_at"] > 6, timeout=60, what="the minimum run time")

    # A premium job needs two devices: the basic job is shrunk to its minimum, not preempted.
    done = tmp_path / "premium-done"
    premium = c.cli("submit", "-q", "--tier", "premium", "--ranks", "2", "--", "sh", "-c",
                    f"while [ ! -e {done} ]; do sleep 0.05; done", cwd=work).stdout.strip()
    c.wait_state(premium, "running", timeout=120)
    j = c.wait_state(job, "running")
    assert j["devices"] == 2 and not j["pinned_devices"]
    assert "preempted" not in [e["kind"] for e in j["events"]], [(e["kind"], e["detail"]) for e in j["events"]]
    shrink = [e for e in j["events"] if e["kind"] == "resize"]
    assert len(shrink) == 1 and shrink[0]["detail"].startswith("from 4 to 2 device(s) by the scheduler"), shrink

    # It ends: the basic job grows back into the idle devices.
    done.touch()
    c.wait_state(premium, "succeeded", timeout=120)
    wait_until(lambda: c.job(job)["devices"] == 4 and not c.job(job)["busy"], timeout=120, what="the job to grow back")
    j = c.show(job)
    grow = [e for e in j["events"] if e["kind"] == "resize"]
    assert [e["detail"].split(" by ")[0] for e in grow] == ["from 4 to 2 device(s)", "from 2 to 4 device(s)"]
    assert len(j["checkpoints"]) == 2

    gate.touch()
    assert c.cli("wait", job, check=False, timeout=600).returncode == 0
    assert _rank_lines(c, job, world) == expected
    assert (work / "params.bin").read_bytes() == params


@pytest.mark.criu
def test_a_job_of_an_ordinary_account_is_resized_and_a_rank_moved(make_cluster, tmp_path: Path,
                                                                   shared_tmp: Path) -> None:
    # Most users are not root: a W = 2 job of "nobody" shrinks to one device, has a rank moved to the other
    # node, grows back, and ends with each rank's output identical to an uninterrupted run.
    c: LiveCluster = make_cluster(nodes=2, devices=2)
    expected_out, _ = reference_run(tmp_path)
    wd = owned_dir(shared_tmp / "work", "nobody")
    gate = shared_tmp / "gate"
    c.become("nobody")
    job = c.cli("submit", "-q", "--env", f"GATE={gate}", "--ranks", "2", "--min-devices", "1", "--", "sh", "-c",
                JOB.replace("progress.txt", "progress-$RANK.txt"), cwd=wd).stdout.strip()
    c.wait_state(job, "running")
    wait_until(lambda: (wd / "progress-1.txt").exists() and len((wd / "progress-1.txt").read_text().split()) >= 10,
               timeout=30, what="progress")
    c.cli("resize", job, "--devices", "1")
    assert c.wait_state(job, "running")["devices"] == 1
    here = {p["rank"]: p["node"] for p in c.job(job)["placement"]}
    other = next(n["name"] for n in c.api().get("/v1/nodes").json() if n["name"] != here[1])
    c.cli("migrate", job, "--rank", "1", "--to", other)
    moved = {p["rank"]: p["node"] for p in c.wait_state(job, "running")["placement"]}
    assert moved[1] == other
    c.cli("resize", job, "--devices", "2")
    assert c.wait_state(job, "running")["devices"] == 2
    gate.touch()
    assert c.cli("wait", job, check=False, timeout=300).returncode == 0
    for rank in (0, 1):
        assert c.cli("logs", job, "--rank", str(rank)).stdout.encode() == expected_out
        st = (wd / f"progress-{rank}.txt").stat()
        assert st.st_uid == pwd.getpwnam("nobody").pw_uid
