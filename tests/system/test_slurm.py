"""Tidal under a real Slurm (Debian's slurmctld, slurmd, munge; a cluster of its own per test, see
:mod:`tidal.testing.slurm`): `tidal run` in a batch script, preempted and requeued by Slurm, or stopped by its
time limit, finishes with output and saved parameters byte-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.mechanisms.criu.provision import find_criu
from tidal.testing.slurm import SlurmCluster, missing_binaries
from tidal.waiting import wait_for_line, wait_until

pytestmark = [pytest.mark.criu, pytest.mark.slow]
TIDAL = Path(sys.executable).with_name("tidal")

# A small deterministic "training": gradient descent on a linear model, one loss line per step, its
# parameters saved at the end. Its steps take wall time so that Slurm's signals land in the middle.
TRAIN = """\
import json, sys, time
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
with open("params.json", "w") as f:
    json.dump({"w": w, "b": b}, f)
print("done")
"""


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): run `make slurm` as root")
    find_criu()  # no skip: `make test` provisions CRIU
    cluster = SlurmCluster(grace=30)
    try:
        yield cluster
    finally:
        cluster.stop()


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


def _script(d: Path, steps: int, pause: float, *extra: str) -> Path:
    script = d / "job.sh"
    script.write_text("#!/bin/sh\n"
                      f"exec {TIDAL} run {' '.join(extra)} -- {sys.executable} train.py {steps} {pause}\n")
    return script


def _env(tmp: Path) -> dict[str, str]:
    return {"TIDAL_HOME": str(tmp / "tidal-home"), "TIDAL_CHECKPOINT_STORE": str(tmp / "store")}


def _explain(slurm: SlurmCluster, d: Path) -> str:
    err = (d / "err.txt").read_text() if (d / "err.txt").exists() else ""
    return f"job stderr:\n{err}\n{slurm.logs()}"


def test_preempted_job_is_requeued_and_finishes_identical(slurm: SlurmCluster, tmp_path: Path) -> None:
    steps = 250
    ref_out, ref_params = _reference(tmp_path, steps)
    d = _workdir(tmp_path, "job")
    job = slurm.sbatch(_script(d, steps, 0.15), "--requeue", "-p", "low", "--output", str(d / "out.txt"),
                       "--error", str(d / "err.txt"), "--open-mode=append", cwd=d, env=_env(tmp_path))
    wait_for_line(d / "out.txt", r"^step 10 ", timeout=60)
    high = tmp_path / "high.sh"
    high.write_text("#!/bin/sh\nexit 0\n")
    hi = slurm.sbatch(high, "-p", "high", "--output", "/dev/null", cwd=tmp_path)
    slurm.wait_state(hi, ["COMPLETED"], timeout=120)
    info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=180)
    assert info["JobState"] == "COMPLETED", _explain(slurm, d)
    assert (d / "out.txt").read_bytes() == ref_out, _explain(slurm, d)
    assert (d / "params.json").read_bytes() == ref_params
    # Slurm's own records show the requeue: one restart, and the preempted end in the completion log.
    assert info["Restarts"] == "1"
    ends = [(c["JobId"], c["JobState"]) for c in slurm.completions() if c["JobId"] == job]
    assert ends == [(job, "PREEMPTED"), (job, "COMPLETED")]
    err = (d / "err.txt").read_text()
    assert "SIGTERM: checkpoint" in err and "committed" in err and "restored from checkpoint" in err
    # A finished job leaves nothing in the store under its key.
    assert not list((tmp_path / "store" / "jobs").glob(f"{job}*")) if (tmp_path / "store" / "jobs").exists() else True
    assert json.loads(ref_params)["w"] != 0.0
