"""Parallelism beyond DDP on CPU with gloo (FSDP2, HSDP over a 2-D DeviceMesh, tensor parallel, a pipeline
schedule, torch.distributed.checkpoint used by the script): each job of 4 ranks is preempted and resumed,
resized onto 2 devices, has one rank migrated to another node, and ends with every rank's loss lines and
parameters byte-identical to plain ``torchrun``. One cluster for all of them, two jobs at a time; the
references run meanwhile."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.system.cluster import free_port as _free_port
from tests.system.cluster import rank_lines as _lines
from tidal.testing import wait_until
from tidal.testing.torchrun import TorchRun

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "parallel_train.py"
ENV = {"OMP_NUM_THREADS": "1"}
MODES = os.environ.get("TIDAL_TEST_PARALLEL_MODES", "fsdp,hsdp,tp,pipeline,dcp").split(",")
WORLD, STEPS, HELD = 4, 16, 12


@pytest.mark.timeout(1500)
def test_fsdp_hsdp_tp_pipeline_dcp_survive_preempt_resize_and_a_rank_migration(make_cluster, tmp_path: Path) -> None:
    open_gate = tmp_path / "open"
    open_gate.touch()  # the references run through, meanwhile

    def args(m: str, g: Path) -> list[str]:
        return ["--mode", m, "--steps", str(STEPS), "--step-time", "0.02", "--gate", f"{g}:{HELD}"]

    refs = {}
    for m in MODES:
        d = tmp_path / f"ref-{m}"
        d.mkdir()
        refs[m] = (d, TorchRun([str(SCRIPT), *args(m, open_gate)], nproc=WORLD, cwd=d, logs=d / "logs",
                               env={**os.environ, **ENV}, options=["--master-port", str(_free_port())]))

    # Two jobs of 4 ranks at a time, on nodes 1 and 2; node 3 has room for the ranks they move.
    c = make_cluster(nodes=3, devices=4)

    def cycle(m: str) -> None:
        """One job's preempt, resume, resize and migration, then its end, against its reference."""
        work, g = tmp_path / f"work-{m}", tmp_path / f"gate-{m}"
        work.mkdir()
        job = c.cli("submit", "-q", "--name", m, "--ranks", str(WORLD), "--min-devices", "1", "--", sys.executable,
                    str(SCRIPT), *args(m, g), cwd=work, env=ENV).stdout.strip()
        c.wait_state(job, "running", timeout=300)
        # Polled once a second: each look is a CLI process, and the cores are the jobs' (and the references').
        wait_until(lambda: len(_lines(c.cli("logs", job, "--rank", "0").stdout)) >= 2, timeout=180,
                   what=f"{m}: first steps", interval=1.0)
        c.cli("preempt", job, timeout=300)
        c.cli("resume", job, timeout=300)
        c.wait_state(job, "running", timeout=300)
        c.cli("resize", job, "--devices", "2", timeout=300)
        assert c.wait_state(job, "running", timeout=300)["devices"] == 2
        c.move_rank(job, 1, "node-3", otherwise="node-1")
        g.touch()
        assert c.cli("wait", job, check=False, timeout=600).returncode == 0, c.cli("show", job).stdout
        d, ref = refs[m]
        ref.wait(600)
        for r in range(WORLD):
            assert _lines(c.cli("logs", job, "--rank", str(r)).stdout) == _lines(ref.stdout(r)), (m, r)
            assert (work / f"params-{r}.bin").read_bytes() == (d / f"params-{r}.bin").read_bytes(), (m, r)

    # Two jobs at a time, each through its whole cycle.
    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(cycle, m) for m in MODES]:
            f.result()
