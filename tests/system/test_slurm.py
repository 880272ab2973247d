"""Tidal under a real Slurm (Debian's slurmctld, slurmd, munge; a cluster of its own per test, see
:mod:`tidal.testing.slurm`): `tidal run` in a batch script, preempted and requeued by Slurm, or stopped by its
time limit, finishes with output and saved parameters byte-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidal.mechanisms.criu.provision import find_criu
from tidal.testing.slurm import SlurmCluster, missing_binaries
from tidal.testing.torchrun import torchrun
from tidal.waiting import wait_for_line, wait_until

pytestmark = [pytest.mark.criu, pytest.mark.slow]
TIDAL = Path(sys.executable).with_name("tidal")

# A small deterministic "training": gradient descent on a linear model, one loss line per step, its
# parameters saved at the end. Its steps take wall time so that Slurm's signals land in the middle.
TRAIN = """\
import json, os, sys, time
steps, pause = int(sys.argv[1]), float(sys.argv[2])
w, b = 0.0, 0.0
data = [(x / 10, 3.0 * x / 10 - 1.0 + ((x * 7919) % 13 - 6) / 100) for x in range(50)]
for step in range(steps):
    gw = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
    gb = sum(2 * (w * x + b - y) for x, y in data) / len(data)
    w, b = w - 0.05 * gw, b - 0.05 * gb
    loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
    print(f"step {step} loss {loss!r}")
    time.sleep(pause)
    while step == 20 and len(sys.argv) == 4 and not os.path.exists(sys.argv[3]):
        time.sleep(0.05)  # held here until the test lets it go on
with open("params.json", "w") as f:
    json.dump({"w": w, "b": b}, f)
print("done")
"""


def _cluster(accounting: bool = False) -> SlurmCluster:
    missing = missing_binaries(accounting)
    if missing:
        pytest.skip(f"Slurm{' with accounting' if accounting else ''} is not installed (missing "
                    f"{', '.join(missing)}): run `make slurm` as root")
    find_criu()  # no skip: `make test` provisions CRIU
    # A preempted job's batch script (tidal run) gets SIGTERM when the GraceTime is over (0: at once; else at
    # Slurm's next 30-second check after it), and has the cluster's KillWait (30 s: ample for a checkpoint on a
    # loaded 2-core machine) before SIGKILL.
    return SlurmCluster(grace=0, accounting=accounting)


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    """Preemption by partition priority, no accounting database."""
    cluster = _cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def _qos_cluster() -> Iterator[SlurmCluster]:
    cluster = _cluster(accounting=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_qos(_qos_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """With Slurm's accounting (slurmdbd, MariaDB): preemption by QOS, and ``sacct``. One cluster for the
    module (its database takes seconds to set up); each test's jobs are cancelled after it."""
    yield _qos_cluster
    _qos_cluster.client("scancel", "--user=root", check=False)
    wait_until(lambda: not _qos_cluster.client("squeue", "-h", check=False).stdout.strip(), timeout=60,
               what="the test's jobs to end")


@dataclass
class LongJob:
    """The job of :func:`test_job_needing_three_times_its_time_limit_finishes_after_requeues`, submitted when
    the module starts and run alongside its other tests."""
    cluster: SlurmCluster | None = None
    job: str = ""
    dir: Path = Path()
    error: BaseException | None = None
    skip: str = ""


LONG_TEST = "test_job_needing_three_times_its_time_limit_finishes_after_requeues"
LONG_STEPS, LONG_PAUSE = 900, 0.2  # 3 minutes of work, sleeping: light on the other tests' CPU


@pytest.fixture(scope="module", autouse=True)
def long_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LongJob]:
    """Where the module runs that test: its own cluster (with accounting), set up in a thread so that the
    module's first tests do not wait for it, and its job submitted at once."""
    found = LongJob()
    if not any(item.name == LONG_TEST for item in request.session.items):
        yield found
        return
    missing = missing_binaries(accounting=True)
    if missing:
        found.skip = (f"Slurm with accounting is not installed (missing {', '.join(missing)}): run `make slurm` "
                      "as root")
        yield found
        return
    tmp = tmp_path_factory.mktemp("long")

    def start() -> None:
        try:
            find_criu()
            found.cluster = SlurmCluster(grace=0, accounting=True)
            found.dir = _workdir(tmp, "job")
            found.job = found.cluster.sbatch(
                _script(found.dir, LONG_STEPS, LONG_PAUSE), "--requeue", "--time=1", "--signal=B:USR1@10",
                "--output", str(found.dir / "out.txt"), "--error", str(found.dir / "err.txt"),
                "--open-mode=append", cwd=found.dir, env=_env(tmp))
        except BaseException as exc:  # the test reports it; the module's other tests go on
            found.error = exc

    starter = threading.Thread(target=start, name="slurm-long-job")
    starter.start()
    try:
        yield found
    finally:
        starter.join()
        if found.cluster is not None:
            found.cluster.stop()


def _workdir(tmp: Path, name: str) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "train.py").write_text(TRAIN)
    return d


def _reference(tmp: Path, steps: int) -> tuple[bytes, bytes]:
    d = _workdir(tmp, "reference")
    out = subprocess.run([sys.executable, "train.py", str(steps), "0"], cwd=d, capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"})
    return out.stdout, (d / "params.json").read_bytes()


def _script(d: Path, steps: int, pause: float, gate: str = "") -> Path:
    script = d / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {TIDAL} run -- {sys.executable} train.py {steps} {pause} {gate}\n")
    return script


def _env(tmp: Path) -> dict[str, str]:
    return {"TIDAL_HOME": str(tmp / "tidal-home"), "TIDAL_CHECKPOINT_STORE": str(tmp / "store")}


def _explain(slurm: SlurmCluster, d: Path) -> str:
    err = (d / "err.txt").read_text() if (d / "err.txt").exists() else ""
    return f"job stderr:\n{err}\n{slurm.logs()}"


def test_job_preempted_by_a_higher_qos_is_requeued_and_finishes_identical(slurm_qos: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    slurm = slurm_qos
    steps = 60
    ref_out, ref_params = _reference(tmp_path, steps)
    d = _workdir(tmp_path, "job")
    gate = tmp_path / "gate"  # the job waits at step 20 until the test has seen it preempted
    job = slurm.sbatch(_script(d, steps, 0.05, str(gate)), "--requeue", "--qos=low", "--output",
                       str(d / "out.txt"), "--error", str(d / "err.txt"), "--open-mode=append", cwd=d,
                       env=_env(tmp_path))
    wait_for_line(d / "out.txt", r"^step 10 ", timeout=60)
    high = tmp_path / "high.sh"
    high.write_text("#!/bin/sh\nexit 0\n")
    hi = slurm.sbatch(high, "--qos=high", "--output", "/dev/null", cwd=tmp_path)
    slurm.wait_state(hi, ["COMPLETED"], timeout=180)
    gate.touch()
    info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=180)
    assert info["JobState"] == "COMPLETED", _explain(slurm, d)
    assert (d / "out.txt").read_bytes() == ref_out, _explain(slurm, d)
    assert (d / "params.json").read_bytes() == ref_params
    # Slurm's own records show the requeue: one restart, the preempted end in the completion log, and in the
    # accounting database the preempted run in QOS low, the high job's run, and the final run.
    assert info["Restarts"] == "1"
    ends = [(c["JobId"], c["JobState"]) for c in slurm.completions() if c["JobId"] == job]
    assert ends == [(job, "PREEMPTED"), (job, "COMPLETED")]
    runs = wait_until(lambda: (r := slurm.sacct(job)) and r[-1]["State"] == "COMPLETED" and r, timeout=30,
                      what=f"sacct to record job {job}'s end")
    assert [(r["JobIDRaw"], r["State"], r["QOS"]) for r in runs] == [(job, "PREEMPTED", "low"),
                                                                      (job, "COMPLETED", "low")]
    (high_run,) = slurm.sacct(hi)
    assert (high_run["State"], high_run["QOS"]) == ("COMPLETED", "high")
    assert runs[0]["End"] <= high_run["Start"] <= runs[1]["Start"]
    err = (d / "err.txt").read_text()
    assert "SIGTERM: checkpoint" in err and "committed" in err and "restored from checkpoint" in err
    assert json.loads(ref_params)["w"] != 0.0


def test_restore_on_a_node_without_criu_fails_clearly_and_keeps_the_checkpoint(slurm: SlurmCluster,
                                                                                tmp_path: Path) -> None:
    d = _workdir(tmp_path, "job")
    env = _env(tmp_path)
    script = _script(d, 400, 0.1)
    script.write_text(script.read_text().replace(
        "exec", f"[ -e {tmp_path / 'no-criu'} ] && export TIDAL_CRIU=/nonexistent/criu\nexec"))
    job = slurm.sbatch(script, "--requeue", "--output", str(d / "out.txt"), "--error",
                       str(d / "err.txt"), "--open-mode=append", cwd=d, env=env)
    wait_for_line(d / "out.txt", r"^step 5 ", timeout=60)
    # Once requeued, the job starts where CRIU does not work (TIDAL_CRIU names a CRIU that is not there).
    (tmp_path / "no-criu").touch()
    slurm.client("scancel", "--batch", "--signal=USR1", job)
    info = slurm.wait_state(job, ["FAILED", "COMPLETED"], timeout=120)
    err = (d / "err.txt").read_text()
    assert info["JobState"] == "FAILED", _explain(slurm, d)
    assert f"error: cannot restore job {job} on node n1: CRIU is not usable here" in err, err
    assert "then requeue the job; its checkpoint" in err
    assert [c.name for c in (tmp_path / "store" / "jobs").iterdir()] == [job]


def test_no_store_configured(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "TIDAL_HOME": str(tmp_path)}
    out = subprocess.run([str(TIDAL), "run", "--", "true"], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "error: tidal run has no checkpoint store: give --store URL or set TIDAL_CHECKPOINT_STORE",
        "hint: a directory on storage every node mounts at the same path, or an s3:// URL; a node-local "
        "directory would not follow the job to other nodes"]


def test_doctor_checks_the_slurm_site(slurm_qos: SlurmCluster, tmp_path: Path) -> None:
    slurm = slurm_qos
    env = {**os.environ, **slurm.env(), "TIDAL_CHECKPOINT_STORE": str(tmp_path / "store")}
    out = subprocess.run([str(TIDAL), "doctor", "--slurm", "-o", "json"], env=env, capture_output=True, text=True,
                         check=False, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert {n: c["status"] for n, c in rows.items()} == {
        "slurm": "ok", "slurm: PreemptMode": "ok", "slurm: GraceTime": "ok", "slurm: signals": "ok",
        "slurm: store": "ok", "slurm: criu on nodes": "ok"}
    assert rows["slurm"]["detail"].startswith("Slurm 22.05")
    assert rows["slurm: PreemptMode"]["detail"] == "REQUEUE (preempt/qos)"
    # The QOS that QOS high preempts.
    assert rows["slurm: GraceTime"]["detail"] == ("qos low=0s (0 s: fine for one-task jobs; a step over several "
                                                  "nodes needs longer than its checkpoint)")
    assert rows["slurm: criu on nodes"]["detail"] == "CRIU works on all 1 node(s)"
    # Without a store: a required check missing, and what to do.
    env.pop("TIDAL_CHECKPOINT_STORE")
    out = subprocess.run([str(TIDAL), "doctor", "--slurm", "-o", "json"], env=env, capture_output=True, text=True,
                         check=False, timeout=180)
    assert out.returncode == 1
    store = {c["name"]: c for c in json.loads(out.stdout)["checks"]}["slurm: store"]
    assert (store["status"], store["detail"]) == ("missing", "no checkpoint store (TIDAL_CHECKPOINT_STORE or --store)")


@pytest.mark.torch
def test_ddp_ranks_of_a_requeued_job_finish_identical_to_torchrun(slurm: SlurmCluster, tmp_path: Path) -> None:
    # The warning of the time limit, sent by hand (`scancel --batch --signal=USR1`, as `--signal=B:USR1@N`
    # does): the moment is the test's, where Slurm's own warning comes at its 30-second checks.
    pytest.importorskip("torch")
    example = Path(__file__).parents[2] / "examples" / "ddp_train.py"
    steps = 150
    ref = tmp_path / "reference"
    ref.mkdir()
    (ref / "ddp_train.py").write_bytes(example.read_bytes())
    # Per rank, as torchrun writes them with --redirects (on one stdout, the ranks' lines can run together).
    run = torchrun(["ddp_train.py", "--steps", str(steps)], nproc=2, cwd=ref,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    want = {rank: run.stdout(rank).encode() for rank in (0, 1)}
    d = tmp_path / "job"
    d.mkdir()
    (d / "ddp_train.py").write_bytes(example.read_bytes())
    script = d / "job.sh"
    script.write_text("#!/bin/sh\nexport OMP_NUM_THREADS=1\n"
                      f"exec {TIDAL} run --ranks-per-node 2 -- {sys.executable} ddp_train.py --steps {steps} "
                      "--step-time 0.05\n")
    job = slurm.sbatch(script, "--requeue", "-p", "low", "--output", str(d / "out.txt"), "--error",
                       str(d / "err.txt"), "--open-mode=append", cwd=d, env=_env(tmp_path))
    wait_for_line(d / "out.txt", r"^rank 1 step 20 ", timeout=120)
    slurm.client("scancel", "--batch", "--signal=USR1", job)
    info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=240)
    assert info["JobState"] == "COMPLETED", _explain(slurm, d)
    assert info["Restarts"] == "1", _explain(slurm, d)
    assert "SIGUSR1: checkpoint" in (d / "err.txt").read_text(), _explain(slurm, d)
    # tidal run writes the ranks' output to Slurm's file whole lines at a time: each rank's lines, in order.
    got = (d / "out.txt").read_bytes().splitlines(keepends=True)
    for rank in (0, 1):
        mine = b"".join(ln for ln in got if ln.startswith(f"rank {rank} ".encode()))
        assert mine == want[rank], _explain(slurm, d)
    assert (d / "params.bin").read_bytes() == (ref / "params.bin").read_bytes()


# The training above, but at step 20 it opens a TCP connection and holds it until a file appears: CRIU cannot
# dump an established connection, so a checkpoint taken meanwhile fails.
CONNECTING = TRAIN.replace("    time.sleep(pause)\n", """    time.sleep(pause)
    if step == 20:
        import os, socket
        while not os.path.exists(sys.argv[3] + ".connect"):
            time.sleep(0.05)
        conn = socket.create_connection(("127.0.0.1", int(sys.argv[4])))
        print("connected", flush=True)
        while not os.path.exists(sys.argv[3] + ".release"):
            time.sleep(0.05)
        conn.close()
""")


def test_failed_checkpoint_requeues_from_the_previous_one(slurm: SlurmCluster, tmp_path: Path) -> None:
    steps = 60
    _, ref_params = _reference(tmp_path, steps)
    d = _workdir(tmp_path, "job")
    (d / "train.py").write_text(CONNECTING)
    gate = tmp_path / "gate"
    with socket.create_server(("127.0.0.1", 0), backlog=8) as server:  # the kernel accepts; nobody reads
        port = server.getsockname()[1]
        script = d / "job.sh"
        script.write_text(f"#!/bin/sh\nexec {TIDAL} run --checkpoint-every 1 -- {sys.executable} train.py {steps} "
                          f"0.05 {gate} {port}\n")
        job = slurm.sbatch(script, "--requeue", "--output", str(d / "out.txt"), "--error", str(d / "err.txt"),
                           "--open-mode=append", cwd=d, env=_env(tmp_path))
        first = wait_for_line(d / "err.txt", r"periodic checkpoint (\S+) of job \S+ committed", timeout=60)
        gate.with_suffix(".connect").touch()
        wait_for_line(d / "out.txt", "^connected$", timeout=60)
        slurm.client("scancel", "--batch", "--signal=USR1", job)
        failed = wait_for_line(d / "err.txt", r"SIGUSR1: checkpoint of job .* goes on from its last checkpoint (\S+),",
                               timeout=60)
        # Refused before anything is frozen, naming the process and its connection.
        assert re.search(r"cannot be checkpointed: process \d+ \(python\) holds a TCP connection "
                         rf"127\.0\.0\.1:\d+ -> 127\.0\.0\.1:{port}", failed.group(0)), failed.group(0)
        wait_for_line(d / "err.txt", f"restored from checkpoint {failed.group(1)} on n1", timeout=120)
        gate.with_suffix(".release").touch()
        info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=120)
    assert info["JobState"] == "COMPLETED", _explain(slurm, d)
    assert info["Restarts"] == "1"
    # Nothing lost: the work since that checkpoint was done again, to the same end (its output lines twice).
    assert (d / "params.json").read_bytes() == ref_params
    assert (d / "out.txt").read_text().endswith("done\n")
    assert failed.group(1) >= first.group(1)


def test_job_needing_three_times_its_time_limit_finishes_after_requeues(long_job: LongJob,
                                                                        tmp_path: Path) -> None:
    # 3 minutes of work under a 1-minute limit, warned 10 s ahead (Slurm checks time limits every 30 s, so the
    # warning comes 0-30 s earlier still; the limit itself is enforced at the first check after it, 30 s after
    # the warning or later): a run does 20-50 s of work, so there are at least four. The job was submitted as
    # the module started (fixture long_job) and ran beside the other tests.
    if long_job.skip:
        pytest.skip(long_job.skip)
    ref_out, ref_params = _reference(tmp_path, LONG_STEPS)
    for _ in range(600):
        if long_job.job or long_job.error:
            break
        time.sleep(0.5)
    if long_job.error is not None:
        raise long_job.error
    slurm, job, d = long_job.cluster, long_job.job, long_job.dir
    assert slurm is not None and job, "the job was not submitted"
    info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout=540)
    assert info["JobState"] == "COMPLETED", _explain(slurm, d)
    assert (d / "out.txt").read_bytes() == ref_out, _explain(slurm, d)
    assert (d / "params.json").read_bytes() == ref_params
    restarts = int(info["Restarts"])
    assert restarts >= 3, info  # 180 s of work, under 50 s a run
    err = (d / "err.txt").read_text()
    assert err.count("SIGUSR1: checkpoint") == restarts, err
    # Slurm's accounting: every run, each requeued but the last, together longer than three limits.
    runs = wait_until(lambda: (r := slurm.sacct(job)) and r[-1]["State"] == "COMPLETED" and r, timeout=30,
                      what=f"sacct to record job {job}'s end")
    assert [r["State"] for r in runs] == ["REQUEUED"] * restarts + ["COMPLETED"], runs
    elapsed = [_seconds(r["Elapsed"]) for r in runs]
    assert sum(elapsed) >= 3 * 60, runs


def _seconds(clock: str) -> int:
    h, m, s = (int(x) for x in clock.split(":"))
    return (h * 60 + m) * 60 + s
