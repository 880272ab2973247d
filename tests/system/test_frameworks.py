"""Real frameworks, unmodified (examples/frameworks/, the versions pinned in requirements.lock): Hugging Face
``transformers``' ``Trainer`` with its own checkpoints, PyTorch Lightning's ``Trainer(strategy="ddp")``, and a
``torch.compile``d DDP model fed by a ``DataLoader`` with persistent workers that logs with TensorBoard's
``SummaryWriter``. Each job of 2 ranks is preempted and resumed, resized onto 1 device, has one rank migrated
to the other node (so it is on 2 devices again), and ends with every rank's loss lines and parameters
byte-identical to plain ``torchrun`` (and the files the frameworks wrote: the same checkpoints kept, the same
TensorBoard scalars, in one event file per writer). One cluster for all of them, each framework imported once
per rank; the references run meanwhile."""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.system.cluster import free_port as _free_port
from tests.system.cluster import rank_lines as _lines
from tidal.testing import wait_until
from tidal.testing.torchrun import TorchRun

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frameworks"
ENV = {"OMP_NUM_THREADS": "1"}
WORLD = 2
# name: (script, its arguments, the step the ranks are held at until the cycle is over)
JOBS = {
    "hf": ("hf_trainer.py", ["--steps", "12"], 8),
    "lightning": ("lightning_ddp.py", ["--steps", "12"], 8),
    "compiled": ("compiled.py", ["--epochs", "4"], 10),
}


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _scalars(d: Path) -> list[tuple[str, list[tuple[int, float]]]]:
    """Per event file under ``d`` (by its directory): the scalars it holds, in order (the wall times differ)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    out = []
    for f in sorted(d.rglob("events.out.tfevents.*")):
        vals = [(e.step, float(make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value)
                for e in EventFileLoader(str(f)).Load() for v in e.summary.value]
        out.append((str(f.parent.relative_to(d)), vals))
    return out


@pytest.mark.timeout(900)
def test_transformers_lightning_and_compiled_jobs_survive_preempt_resize_and_a_rank_migration(
        make_cluster, tmp_path: Path) -> None:
    gate, open_gate = tmp_path / "gate", tmp_path / "open"
    open_gate.touch()  # the references run through, meanwhile

    def args(name: str, g: Path) -> list[str]:
        script, extra, held = JOBS[name]
        return [str(EXAMPLES / script), *extra, "--gate", f"{g}:{held}"]

    refs = {}
    for name in JOBS:
        d = tmp_path / f"ref-{name}"
        d.mkdir()
        refs[name] = (d, TorchRun(args(name, open_gate), nproc=WORLD, cwd=d, logs=d / "logs",
                                  env={**os.environ, **ENV}, options=["--master-port", str(_free_port())]))

    c = make_cluster(nodes=2, devices=4)
    # The compiled job's compiler cache (a temporary directory, apart from the references'): it is removed while
    # the job is preempted, as on a machine that never had it.
    cache = tmp_path / "inductor-cache"
    jobs = {}
    for name in JOBS:
        work = tmp_path / f"work-{name}"
        work.mkdir()
        env = ["--env", f"TORCHINDUCTOR_CACHE_DIR={cache}"] if name == "compiled" else []
        jobs[name] = c.cli("submit", "-q", "--name", name, "--ranks", str(WORLD), "--min-devices", "1", *env, "--",
                           sys.executable, *args(name, gate), cwd=work, env=ENV).stdout.strip()

    def cycle(name: str, job: str) -> None:
        c.wait_state(job, "running", timeout=120)
        # Polled once a second: each look is a CLI process, and the cores are the jobs' (and the references').
        wait_until(lambda: len(_lines(c.cli("logs", job, "--rank", "0").stdout)) >= 2, timeout=180,
                   what=f"{name}: first steps", interval=1.0)
        c.cli("preempt", job, timeout=300)
        if name == "compiled":
            assert any(cache.rglob("*.so"))
            shutil.rmtree(cache)
        c.cli("resume", job, timeout=300)
        c.wait_state(job, "running", timeout=300)
        if name == "compiled":  # what the ranks had loaded from it is back
            assert any(cache.rglob("*.so"))
        c.cli("resize", job, "--devices", "1", timeout=300)
        assert c.wait_state(job, "running", timeout=300)["devices"] == 1
        here = c.job(job)["placement"][1]["node"]
        to = "node-2" if here == "node-1" else "node-1"
        c.migrate_rank(job, 1, to)
        j = c.wait_state(job, "running", timeout=300)
        # Rank 1 moved, rank 0 stayed: on 2 devices again.
        assert j["placement"][1]["node"] == to and j["placement"][0]["node"] == here, j["placement"]
        assert j["devices"] == 2

    # The jobs go through their cycles side by side, each as soon as it has made its first steps.
    with ThreadPoolExecutor(len(jobs)) as pool:
        for f in [pool.submit(cycle, name, job) for name, job in jobs.items()]:
            f.result()
    gate.touch()
    for name, job in jobs.items():
        assert c.cli("wait", job, check=False, timeout=600).returncode == 0, c.cli("show", job).stdout
        d, ref = refs[name]
        ref.wait(600)
        work = tmp_path / f"work-{name}"
        for r in range(WORLD):
            assert _lines(c.cli("logs", job, "--rank", str(r)).stdout) == _lines(ref.stdout(r)), (name, r)
            assert (work / f"params-{r}.bin").read_bytes() == (d / f"params-{r}.bin").read_bytes(), (name, r)
    # What the frameworks wrote besides: the Trainer's checkpoints (the two newest kept) and final model; Lightning's
    # logs and checkpoint; one TensorBoard event file per writer, with every step's scalar in order.
    hf, ref = tmp_path / "work-hf", tmp_path / "ref-hf"
    assert _files(hf / "out") == _files(ref / "out")
    assert (hf / "out/final/model.safetensors").read_bytes() == (ref / "out/final/model.safetensors").read_bytes()
    lt, ref = tmp_path / "work-lightning", tmp_path / "ref-lightning"
    assert _files(lt / "lightning_logs/version_0/checkpoints") == _files(ref / "lightning_logs/version_0/checkpoints")
    assert _scalars(lt / "lightning_logs") == _scalars(ref / "lightning_logs")
    cp, ref = tmp_path / "work-compiled", tmp_path / "ref-compiled"
    got = _scalars(cp / "runs")
    assert got == _scalars(ref / "runs")
    assert [len(v) for _, v in got] == [16] * WORLD
