"""A job checkpointed and restored on the same machine from the images dumped here, while the commit to the
store runs in the background (``Job.checkpoint_local`` + ``Job.restore(local=...)``): the run must be
byte-identical to an uninterrupted one, and a commit that fails after the restore must leave the job
running and the older committed checkpoint its fallback."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import pytest

from tests.integration.ranks import Cluster, reference_run, train_argv
from tidal.errors import CheckpointError, ValidationError
from tidal.mechanisms.criu.job import Job, LocalDump
from tidal.mechanisms.storage import CheckpointWriter
from tidal.testing import wait_for_line

pytestmark = [pytest.mark.torch, pytest.mark.slow]

STEPS = 60


def _same_as_reference(cluster: Cluster, out: bytes, ref: bytes) -> None:
    assert out == ref
    for name in ("params.bin", "metrics.csv"):
        assert (cluster.workdir / name).read_bytes() == (cluster.root / "ref" / name).read_bytes(), name


def test_local_restores_identical(cluster: Cluster) -> None:
    """Two moves: on the same node root, then onto another node root of this machine. Each commit ends
    after its restore started the rank again; every checkpoint is committed in the end."""
    argv = train_argv("--steps", str(STEPS), "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    nodes = cluster.nodes
    job = Job.launch("job", [(spec, nodes[0])], cluster.store)
    committed: list[LocalDump] = []
    done = threading.Event()

    def on_commit(d: LocalDump) -> None:
        committed.append(d)
        done.set()

    ids = []
    for step, target in ((10, nodes[0]), (30, nodes[1])):
        wait_for_line(job.ranks[0].node.log_path(spec), rf"^step {step} ")
        done.clear()
        old = job.ranks[0]
        local = job.checkpoint_local(on_commit=on_commit)
        assert old.wait(30).signal == signal.SIGKILL
        job = Job.restore(cluster.store, "job", [(spec, target)], local=local)
        assert job.ranks[0].node is target and job.ranks[0].running
        rt = job.restore_timing
        assert rt is not None and rt.fetched_bytes == 0 and rt.image_bytes > 0
        info = local.wait(60)
        assert done.wait(10) and committed[-1] is local and local.error is None
        assert cluster.store.latest("job").id == info.id  # type: ignore[union-attr]
        ids.append(info.id)
    status = job.wait(300)
    assert [s.code for s in status] == [0]
    _same_as_reference(cluster, job.ranks[0].node.log_path(spec).read_bytes(), ref)
    assert [c.id for c in cluster.store.list("job")] == ids
    # Nothing of the local dumps is left once the job ended.
    assert not any(d.staging.exists() for d in committed)


def test_commit_failing_after_local_restore(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The store refuses the commit of the checkpoint a local restore started from: the job runs on from
    its dump, the failure is reported, the older committed checkpoint stays the latest, and restoring
    from it still ends identical to an uninterrupted run (nothing lost)."""
    argv = train_argv("--steps", str(STEPS), "--step-time", "0.05")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    node = cluster.nodes[0]
    log = node.log_path(spec)
    job = Job.launch("job", [(spec, node)], cluster.store)
    wait_for_line(log, r"^step 10 ")
    first = job.checkpoint(then="continue")
    wait_for_line(log, r"^step 20 ")

    commit = CheckpointWriter.commit
    release = threading.Event()

    def failing(self: CheckpointWriter, *a: Any, **kw: Any) -> Any:
        release.wait(30)  # the restore comes first
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(CheckpointWriter, "commit", failing)
    reports: list[LocalDump] = []
    caplog.set_level(logging.ERROR, logger="tidal.mechanisms.criu.job")
    local = job.checkpoint_local(on_commit=reports.append)
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], local=local)
    release.set()
    with pytest.raises(CheckpointError, match="was not committed"):
        local.wait(60)
    monkeypatch.setattr(CheckpointWriter, "commit", commit)
    assert reports == [local] and isinstance(local.error, OSError)
    assert any("was not committed" in r.getMessage() for r in caplog.records)
    # The failed checkpoint does not exist; the older one is the fallback.
    assert [c.id for c in cluster.store.list("job")] == [first.id]
    assert cluster.store.latest("job").id == first.id  # type: ignore[union-attr]
    # The job went on from its dump.
    restored_log = cluster.nodes[1].log_path(spec)
    wait_for_line(restored_log, r"^step 25 ")
    assert job.ranks[0].running
    # A later checkpoint of it commits (without the failed dump as its comparison base).
    second = job.checkpoint(then="kill")
    assert cluster.store.latest("job").id == second.id  # type: ignore[union-attr]
    # Falling back to the older checkpoint: the run still ends as the uninterrupted one.
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[2])], checkpoint_id=first.id)
    status = job.wait(300)
    assert [s.code for s in status] == [0]
    _same_as_reference(cluster, cluster.nodes[2].log_path(spec).read_bytes(), ref)


def test_images_kept_by_a_killing_checkpoint_are_restored_without_a_fetch(cluster: Cluster) -> None:
    """``checkpoint(then="kill", keep_images=True)``: committed first (the usual order), its images kept here;
    a restore given them (``prestaged=``) fetches nothing of them and ends identical to an uninterrupted run.
    Without ``keep_images`` nothing is kept."""
    argv = train_argv("--steps", str(STEPS), "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    nodes = cluster.nodes
    job = Job.launch("job", [(spec, nodes[0])], cluster.store)
    wait_for_line(nodes[0].log_path(spec), r"^step 10 ")
    info = job.checkpoint("kill", keep_images=True)
    assert cluster.store.latest("job").id == info.id  # type: ignore[union-attr]
    kept = job.take_images()
    assert list(kept) == [0] and kept[0].nbytes > 0 and job.take_images() == {}
    job = Job.restore(cluster.store, "job", [(spec, nodes[1])], checkpoint_id=info.id, prestaged=kept)
    rt = job.restore_timing
    assert rt is not None and rt.image_bytes > 0 and rt.fetched_bytes < 0.01 * rt.image_bytes, rt
    wait_for_line(nodes[1].log_path(spec), r"^step 30 ")
    job.checkpoint("kill")
    assert job.take_images() == {}
    job = Job.restore(cluster.store, "job", [(spec, nodes[0])])
    rt = job.restore_timing
    assert rt is not None and rt.fetched_bytes > 0.5 * rt.image_bytes, rt
    assert [s.code for s in job.wait(300)] == [0]
    _same_as_reference(cluster, nodes[0].log_path(spec).read_bytes(), ref)
    with pytest.raises(ValidationError, match="keep_images is for a checkpoint that kills the job"):
        job.checkpoint("continue", keep_images=True)


def test_a_local_restore_after_the_commit_ended_is_identical(cluster: Cluster) -> None:
    """The restore comes once the commit has ended (as when a control plane's answer is awaited between them):
    the images are still there, and the run ends identical."""
    argv = train_argv("--steps", str(STEPS), "--step-time", "0.02")
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    node = cluster.nodes[0]
    job = Job.launch("job", [(spec, node)], cluster.store)
    wait_for_line(node.log_path(spec), r"^step 10 ")
    local = job.checkpoint_local()
    local.wait(60)
    job = Job.restore(cluster.store, "job", [(spec, node)], local=local)
    assert [s.code for s in job.wait(300)] == [0]
    _same_as_reference(cluster, node.log_path(spec).read_bytes(), ref)
