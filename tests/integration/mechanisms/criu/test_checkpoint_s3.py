"""Checkpoints of real processes in a checkpoint store on S3 (SeaweedFS on loopback): committed there and
restored from there byte-identical, and an S3 server that stops in the middle of a checkpoint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.ranks import Cluster, reference_run
from tidal.errors import CheckpointError, StorageError
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.retry import RetryPolicy
from tidal.testing import wait_for_line
from tidal.testing.seaweedfs import SeaweedFS

pytestmark = pytest.mark.s3

# A shell loop and a Python process under it; both write to the log and to a file of the working directory.
LOOP = ["sh", "-c", 'i=0; while [ $i -lt 50 ]; do i=$((i+1)); echo "tick $i"; echo $i >> out.txt; sleep 0.02; '
        "done; python3 -c 'print(open(\"out.txt\").read().split()[-1])'; echo done"]


@pytest.fixture
def s3_store(seaweedfs: SeaweedFS, s3_url: str) -> Iterator[CheckpointStore]:
    store = CheckpointStore(s3_url, gc_grace=0, **seaweedfs.store_options())
    yield store
    store.backend.delete_tree("")
    store.close()


def test_checkpoint_committed_to_s3_and_restored_from_it(cluster: Cluster, seaweedfs: SeaweedFS, s3_url: str,
                                                         s3_store: CheckpointStore) -> None:
    # The loop waits at tick 30 until the gate (outside the working directory) is there: still running at the
    # second checkpoint, however long the first one took on a loaded machine.
    gate = cluster.root / "gate"
    loop = [LOOP[0], LOOP[1], LOOP[2].replace(
        "sleep 0.02;", f"if [ $i -eq 30 ]; then while [ ! -e {gate} ]; do sleep 0.05; done; fi; sleep 0.02;")]
    spec = cluster.spec(loop)
    gate.touch()
    ref = reference_run(loop, cluster.root / "ref", spec.launch_env())
    gate.unlink()
    job = Job.launch("job", [(spec, cluster.nodes[0])], s3_store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 10$")
    first = job.checkpoint(then="continue")
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 25$")
    second = job.checkpoint(then="kill", keep=1)
    gate.touch()
    assert [c.id for c in s3_store.list("job")] == [second.id]
    assert second.stored_bytes < second.logical_bytes  # the unchanged pages of `first` are not stored again
    assert first.id != second.id
    # Another node reaches the store with a client of its own.
    there = CheckpointStore(s3_url, **seaweedfs.store_options())
    there.verify("job", second.id)
    job = Job.restore(there, "job", [(spec, cluster.nodes[1])])
    assert [s.code for s in job.wait(60)] == [0]
    assert cluster.nodes[1].log_path(spec).read_bytes() == ref
    there.close()


def test_server_stopped_during_a_checkpoint(cluster: Cluster) -> None:
    # The loop waits at tick 20 until the gate (outside the working directory) is there, so that it is still
    # running when the server is back, whatever the outage took.
    gate = cluster.root / "gate"
    loop = [LOOP[0], LOOP[1], LOOP[2].replace(
        "sleep 0.02;", f"if [ $i -eq 20 ]; then while [ ! -e {gate} ]; do sleep 0.05; done; fi; sleep 0.02;")]
    server = SeaweedFS()  # its own: this test stops it
    try:
        store = CheckpointStore(f"s3://{server.bucket}/t", gc_grace=0, retry=RetryPolicy(attempts=3, base=0.1, cap=0.2),
                                **server.store_options())
        spec = cluster.spec(loop)
        gate.touch()
        ref = reference_run(loop, cluster.root / "ref", spec.launch_env())
        gate.unlink()
        log = cluster.nodes[0].log_path(spec)
        job = Job.launch("job", [(spec, cluster.nodes[0])], store)
        wait_for_line(log, r"^tick 5$")
        good = job.checkpoint(then="continue")
        wait_for_line(log, r"^tick 15$")
        pid = job.ranks[0].pid

        put_chunk = store.backend.put_chunk
        stopped = []

        def stop_first(key: str, tag: bytes, payload: bytes | memoryview) -> int:
            if not stopped:
                stopped.append(key)
                server.shutdown()  # the S3 server goes away in the middle of the checkpoint's uploads
            return put_chunk(key, tag, payload)

        store.backend.put_chunk = stop_first  # type: ignore[method-assign]
        with pytest.raises(CheckpointError) as err:
            job.checkpoint(then="kill")
        assert stopped
        assert isinstance(err.value.__cause__, StorageError)
        assert "checkpoint store error" in str(err.value) and err.value.fields["reason"] == "unavailable"
        assert job.ranks[0].running and job.ranks[0].pid == pid  # the job goes on

        server.start()
        store.backend.put_chunk = put_chunk  # type: ignore[method-assign]
        assert [c.id for c in store.list("job")] == [good.id]
        store.verify("job", good.id)  # the last committed checkpoint is intact
        wait_for_line(log, r"^tick 20$")
        last = job.checkpoint(then="kill")  # and checkpoints succeed again
        assert [c.id for c in store.list("job")] == [good.id, last.id]
        gate.touch()
        job = Job.restore(store, "job", [(spec, cluster.nodes[1])])
        assert [s.code for s in job.wait(60)] == [0]
        assert cluster.nodes[1].log_path(spec).read_bytes() == ref
        # The checkpoint from before the outage restores too.
        job = Job.restore(store, "job", [(spec, cluster.nodes[2])], checkpoint_id=good.id)
        assert [s.code for s in job.wait(60)] == [0]
        assert cluster.nodes[2].log_path(spec).read_bytes() == ref
        store.close()
    finally:
        server.stop()
