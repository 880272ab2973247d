"""Bad input and faults: the user learns what happened, and the last good checkpoint survives."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.ranks import Cluster, reference_run, train_argv
from tidal.errors import CheckpointError, RankExited, Unsupported
from tidal.mechanisms.criu.fsstate import scan
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.runner import CriuRunner
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing import wait_for_line

# Long enough (about 4 s) that a checkpoint taken at tick 25 on a loaded machine still finds it running.
LOOP = ["sh", "-c", 'i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo "tick $i"; echo $i >> out.txt; sleep 0.02; '
        "done; echo done"]


def _chunk_path(store_root: Path, digest: str) -> Path:
    return store_root / "chunks" / digest[:2] / digest


def _chunks(store: CheckpointStore, checkpoint_id: str) -> dict[str, str]:
    """chunk digest -> name of a file of the checkpoint that uses it"""
    reader = store.reader("job", checkpoint_id)
    return {h: name for name in reader.names() for h, _ in reader.entry(name).chunks}


@pytest.mark.parametrize("damage", ["flip-byte", "delete-chunk"])
def test_corrupt_checkpoint_is_named_and_previous_restores(cluster: Cluster, damage: str) -> None:
    spec = cluster.spec(LOOP)
    ref = reference_run(LOOP, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 10$")
    good = job.checkpoint(then="continue")
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 25$")
    bad = job.checkpoint(then="kill")
    only_bad = {h: n for h, n in _chunks(cluster.store, bad.id).items()
                if h not in _chunks(cluster.store, good.id) and "/images/pages-" in n}
    digest, name = sorted(only_bad.items())[0]
    chunk = _chunk_path(cluster.root / "store", digest)
    if damage == "flip-byte":
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0xFF
        chunk.write_bytes(bytes(data))
    else:
        chunk.unlink()
    before = scan(cluster.workdir)
    with pytest.raises(CheckpointError) as err:
        Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])])
    assert digest in str(err.value) and name in str(err.value)
    assert scan(cluster.workdir) == before  # nothing was touched by the failed restore
    with pytest.raises(CheckpointError):
        cluster.store.verify("job", bad.id)
    cluster.store.verify("job", good.id)
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], checkpoint_id=good.id)
    assert [s.code for s in job.wait(60)] == [0]
    assert cluster.nodes[1].log_path(spec).read_bytes() == ref


def test_unknown_checkpoint_is_a_clear_error(cluster: Cluster) -> None:
    spec = cluster.spec(LOOP)
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        Job.restore(cluster.store, "job", [(spec, cluster.nodes[0])])
    with pytest.raises(CheckpointError, match="000042-abcdef"):
        Job.restore(cluster.store, "job", [(spec, cluster.nodes[0])], checkpoint_id="000042-abcdef")


def test_criu_failure_leaves_job_running_and_last_checkpoint(cluster: Cluster) -> None:
    # A deleted-but-open file larger than CRIU's ghost limit makes the dump itself fail.
    argv = ["sh", "-c", 'exec 3>scratch; echo 0123456789 >&3; rm scratch; i=0; while [ $i -lt 50 ]; do '
            'i=$((i+1)); echo "tick $i"; sleep 0.02; done']
    spec = cluster.spec(argv)
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    log = cluster.nodes[0].log_path(spec)
    wait_for_line(log, r"^tick 5$")
    good = job.checkpoint(then="continue")
    wait_for_line(log, r"^tick 15$")
    pid = job.ranks[0].pid
    job.ghost_limit = 1
    with pytest.raises(CheckpointError, match="criu dump .* failed"):
        job.checkpoint(then="kill")
    assert job.ranks[0].running and job.ranks[0].pid == pid
    assert [c.id for c in cluster.store.list("job")] == [good.id]
    assert [s.code for s in job.wait(60)] == [0]
    assert log.read_bytes() == ref


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    mnt = tmp_path / "small-store"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_full_store_leaves_job_running_and_last_checkpoint(cluster: Cluster, small_store: Path) -> None:
    store = CheckpointStore(str(small_store / "store"))
    spec = cluster.spec(LOOP)
    ref = reference_run(LOOP, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], store)
    log = cluster.nodes[0].log_path(spec)
    wait_for_line(log, r"^tick 5$")
    good = job.checkpoint(then="continue")
    # Fill the store's file system to the last byte.
    with open(small_store / "filler", "wb") as f, pytest.raises(OSError):
        while True:
            f.write(os.urandom(1 << 20))
            f.flush()
    wait_for_line(log, r"^tick 15$")
    pid = job.ranks[0].pid
    with pytest.raises(CheckpointError, match="full|space"):
        job.checkpoint(then="kill")
    assert job.ranks[0].running and job.ranks[0].pid == pid
    assert [c.id for c in store.list("job")] == [good.id]
    assert [s.code for s in job.wait(60)] == [0]
    assert log.read_bytes() == ref
    # The last good checkpoint is intact and restorable.
    (small_store / "filler").unlink()
    store.verify("job", good.id)
    job = Job.restore(store, "job", [(spec, cluster.nodes[1])])
    assert [s.code for s in job.wait(60)] == [0]
    assert cluster.nodes[1].log_path(spec).read_bytes() == ref


def test_checkpoint_of_exited_job_says_so(cluster: Cluster) -> None:
    job = Job.launch("job", [(cluster.spec(["true"]), cluster.nodes[0])], cluster.store)
    job.wait(30)
    with pytest.raises(RankExited, match="has exited"):
        job.checkpoint()
    assert cluster.store.list("job") == []


def test_restore_without_workdir_says_so(cluster: Cluster) -> None:
    spec = cluster.spec(LOOP)
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 5$")
    job.checkpoint(then="kill")
    moved = cluster.workdir.with_name("moved")
    cluster.workdir.rename(moved)
    with pytest.raises(CheckpointError, match="working directory .* does not exist"):
        Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])])
    moved.rename(cluster.workdir)
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])])
    assert [s.code for s in job.wait(60)] == [0]


def test_launch_without_workdir_says_so(cluster: Cluster) -> None:
    spec = cluster.spec(["true"])
    cluster.workdir.rmdir()
    from tidal.errors import MechanismError

    with pytest.raises(MechanismError, match="does not exist"):
        Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)


def test_pre_dump_where_supported_else_unsupported(cluster: Cluster) -> None:
    spec = cluster.spec(LOOP)
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 3$")
    try:
        if job.runner.supports("mem_dirty_track"):
            job.pre_dump()
            assert job.ranks[0].running
        else:
            with pytest.raises(Unsupported, match="dirty-tracking"):
                job.pre_dump()
            assert job.ranks[0].running
    finally:
        job.kill()


class _StalledPager(CriuRunner):
    """Its lazy-pages daemon is stopped by the restore's post-restore action script: after the restore has
    handed it the rank's memory, before the restore tells it that it is finished, which is when it starts to
    push pages in the background (stopped once the restore had exited, it had pushed all 0.4 GB first on a
    busy machine). The rank then waits on its first page fault until the test kills the daemon."""

    def _start_pager(self, images: Path, timeout: float = 10.0) -> subprocess.Popen[bytes]:
        self.pager = super()._start_pager(images, timeout)
        return self.pager

    def _run(self, args: list[str], log: Path, pass_fds: tuple[int, ...] = (), what: str = "criu",
             timeout: float = 600, preload: Path | None = None) -> None:
        if args[0] == "restore":
            script = log.parent / "stop-pager.sh"
            script.write_text('#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = post-restore ] || exit 0\n'
                              f"exec kill -STOP {self.pager.pid}\n")
            script.chmod(0o700)
            args = [*args, "--action-script", str(script)]
        super()._run(args, log, pass_fds, what, timeout, preload)
        if args[0] == "restore":
            state = Path(f"/proc/{self.pager.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state == "T", f"the lazy-pages daemon is not stopped after the restore (state {state})"


def test_a_lazy_restore_whose_pager_dies_kills_the_job(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Once the daemon that fills in a lazily restored rank's memory is gone, the rank's missing pages
    would read as zeros: the rank is killed rather than left to go on with them."""
    spec = cluster.spec(train_argv("--steps", "100000", "--step-time", "0.02", "--dataset-mb", "200"))
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^step 3 ")
    job.checkpoint(then="kill")
    runner = _StalledPager()
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], runner=runner)
    with caplog.at_level(logging.ERROR, logger="tidal.mechanisms.criu.job"):
        os.kill(runner.pager.pid, signal.SIGKILL)
        # Once the daemon is gone the kernel serves the rank's pending fault with a zero page: on a busy
        # machine the rank may crash on it (SIGSEGV, SIGBUS) before Tidal's kill lands. Either way it does
        # not go on, and Tidal has seen why.
        (ended,) = job.wait(60)
        assert ended.signal in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS), ended
    assert "rank job.r0: criu lazy-pages, which restored its memory, exited with code -9; killing the job" in (
        caplog.text)
