"""An unmodified PyTorch training script, checkpointed, killed and restored: its per-step output and
final parameters must be byte-identical to an uninterrupted run."""

from __future__ import annotations

import signal

import pytest

from tests.integration.ranks import Cluster, reference_run, train_argv
from tidal.mechanisms.criu.job import Job
from tidal.testing import wait_for_line

pytestmark = [pytest.mark.torch, pytest.mark.slow]

STEPS = 60


def _run_with_checkpoints(cluster: Cluster, argv: list[str], stops: list[int]) -> tuple[bytes, Job]:
    """Checkpoint at each step in ``stops`` (kill, then restore on the next node root)."""
    nodes = cluster.nodes
    spec = cluster.spec(argv)
    job = Job.launch("job", [(spec, nodes[0])], cluster.store)
    pids = {job.ranks[0].pid}
    for i, step in enumerate(stops):
        node = job.ranks[0].node
        wait_for_line(node.log_path(spec), rf"^step {step} ")
        job.checkpoint(then="kill")
        assert job.ranks[0].wait(30).signal == signal.SIGKILL  # killed once committed
        target = nodes[(i + 1) % len(nodes)]
        job = Job.restore(cluster.store, "job", [(spec, target)])
        assert job.ranks[0].node is target
        pids.add(job.ranks[0].pid)
    status = job.wait(300)
    assert [s.code for s in status] == [0]
    assert len(pids) == len(stops) + 1
    assert len(cluster.store.list("job")) == len(stops)
    return job.ranks[0].node.log_path(spec).read_bytes(), job


@pytest.mark.parametrize("stops", [[10], [7, 30], [5, 21, 44]], ids=["1-checkpoint", "2-checkpoints", "3-checkpoints"])
def test_training_identical_after_checkpoints(cluster: Cluster, stops: list[int]) -> None:
    argv = train_argv("--steps", str(STEPS), "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    out, _ = _run_with_checkpoints(cluster, argv, stops)
    assert out == ref
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()
    assert (cluster.workdir / "metrics.csv").read_bytes() == (cluster.root / "ref" / "metrics.csv").read_bytes()


def test_dataloader_workers_identical(cluster: Cluster) -> None:
    argv = train_argv("--steps", "50", "--workers", "2", "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    out, _job = _run_with_checkpoints(cluster, argv, [12, 31])
    assert out == ref
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()


def test_periodic_checkpoint_keeps_running_and_older_restore_rolls_back(cluster: Cluster) -> None:
    """Checkpoints taken while the job runs; then restoring the *older* one after the job went on
    writing: the output and the working directory roll back, and the run still ends identical. (Steps to
    spare after the last wait: a checkpoint on a loaded machine takes seconds, and the run must not end
    before it.)"""
    argv = train_argv("--steps", "300", "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    node = cluster.nodes[0]
    job = Job.launch("job", [(spec, node)], cluster.store)
    log = node.log_path(spec)
    wait_for_line(log, r"^step 15 ")
    first = job.checkpoint(then="continue")
    first_pid = job.ranks[0].pid
    wait_for_line(log, r"^step 30 ")
    job.checkpoint(then="continue")
    assert job.ranks[0].pid == first_pid and job.ranks[0].running
    wait_for_line(log, r"^step 45 ")
    job.kill()
    metrics_at_kill = (cluster.workdir / "metrics.csv").read_text().splitlines()
    assert len(metrics_at_kill) >= 45
    restored = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], checkpoint_id=first.id)
    assert [s.code for s in restored.wait(300)] == [0]
    assert cluster.nodes[1].log_path(spec).read_bytes() == ref
    assert (cluster.workdir / "metrics.csv").read_bytes() == (cluster.root / "ref" / "metrics.csv").read_bytes()
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()


def test_prestaged_migration_identical(cluster: Cluster) -> None:
    """Pre-copy: the target stages the last periodic checkpoint; the migration then takes only what
    changed since from the store, patching the staged images in place. The run still ends byte-identical.
    (The job is held while the target stages, so that staging cannot outlast what is left of the run.)"""
    argv = train_argv("--steps", str(STEPS), "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    src, dst = cluster.nodes[0], cluster.nodes[1]
    job = Job.launch("job", [(spec, src)], cluster.store)
    wait_for_line(src.log_path(spec), r"^step 10 ")
    job.checkpoint(then="hold")
    staged = Job.prestage(cluster.store, "job", [(spec, dst)])
    assert staged[0].dir is not None and any(staged[0].dir.iterdir())
    job.release()
    wait_for_line(src.log_path(spec), r"^step 30 ")
    job.checkpoint(then="kill")
    job = Job.restore(cluster.store, "job", [(spec, dst)], prestaged=staged)
    assert staged[0].dir is None  # consumed
    assert [s.code for s in job.wait(300)] == [0]
    assert dst.log_path(spec).read_bytes() == ref
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()
