"""An unmodified PyTorch training script on the live cluster: preempted, resumed and migrated, it prints
the same per-step losses and ends with the same parameters, byte for byte, as an uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.testing import pid_alive, wait_until

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
ARGS = ["--steps", "80", "--step-time", "0.08", "--dataset-mb", "4"]


def test_torch_job_preempted_resumed_migrated_is_bit_identical(make_cluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {"OMP_NUM_THREADS": "1"}  # the same math as the reference below, whatever the device's cores
    ref = tmp_path / "ref"
    ref.mkdir()
    expected = subprocess.run([sys.executable, str(TRAIN), *ARGS], cwd=ref, env={**os.environ, **env},
                              capture_output=True, check=True, timeout=300).stdout

    c = make_cluster(nodes=2, devices=1)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--name", "train", "--", sys.executable, str(TRAIN), *ARGS, cwd=work,
                env=env).stdout.strip()
    pid1 = c.wait_state(job, "running")["placement"][0]["pid"]
    metrics = work / "metrics.csv"
    wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5, timeout=60,
               what="training steps")
    c.cli("preempt", job)
    assert not pid_alive(pid1)
    c.cli("resume", job)
    j = c.show(job)
    pid2, node2 = j["placement"][0]["pid"], j["placement"][0]["node"]
    assert pid2 != pid1
    c.cli("migrate", job)
    j = c.show(job)
    assert j["placement"][0]["node"] != node2 and j["placement"][0]["pid"] not in (pid1, pid2)
    assert len(j["checkpoints"]) == 2
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected
    assert (work / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()
    assert (work / "params.bin").read_bytes() == (ref / "params.bin").read_bytes()
