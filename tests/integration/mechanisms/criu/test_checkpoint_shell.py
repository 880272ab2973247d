"""Any process tree, not only Python: a shell loop, checkpointed and restored, also twice side by side."""

from __future__ import annotations

import os
import stat

from tests.integration.ranks import Cluster, reference_run
from tidal.mechanisms.criu.job import Job
from tidal.testing import wait_for_line

LOOP = ["sh", "-c", 'i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo "tick $i"; sleep 0.02; done; echo done']


def test_shell_loop_checkpoint_restore(cluster: Cluster) -> None:
    spec = cluster.spec(LOOP)
    ref = reference_run(LOOP, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 10$")
    job.checkpoint(then="kill")
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])])
    wait_for_line(cluster.nodes[1].log_path(spec), r"^tick 30$")
    job.checkpoint(then="kill")
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[2])])
    assert [s.code for s in job.wait(60)] == [0]
    assert cluster.nodes[2].log_path(spec).read_bytes() == ref


def test_restored_on_the_same_node_while_the_killed_copy_is_reaped(cluster: Cluster) -> None:
    # A checkpoint that kills returns without waiting for the kernel to tear the ranks down; a restore on
    # the same node root (a resize, a resume in place) waits for the old copy only where they would meet.
    loop = [LOOP[0], LOOP[1], LOOP[2].replace("sleep 0.02", "sleep 0.05")]
    spec = cluster.spec(loop)
    ref = reference_run(loop, cluster.root / "ref", spec.launch_env())
    node = cluster.nodes[0]
    job = Job.launch("job", [(spec, node)], cluster.store)
    for tick in (10, 25, 40):
        wait_for_line(node.log_path(spec), rf"^tick {tick}$")
        old = job.ranks[0]
        job.checkpoint(then="kill")
        job = Job.restore(cluster.store, "job", [(spec, node)])
        assert old.wait(30).signal == 9 and job.ranks[0].pid != old.pid
    assert [s.code for s in job.wait(60)] == [0]
    assert node.log_path(spec).read_bytes() == ref


def test_same_checkpoint_restored_twice_side_by_side(cluster: Cluster) -> None:
    spec = cluster.spec(LOOP)
    ref = reference_run(LOOP, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 20$")
    info = job.checkpoint(then="kill")
    a = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], checkpoint_id=info.id)
    b = Job.restore(cluster.store, "job", [(spec, cluster.nodes[2])], checkpoint_id=info.id)
    assert a.ranks[0].pid != b.ranks[0].pid
    assert [s.code for s in a.wait(60) + b.wait(60)] == [0, 0]
    assert cluster.nodes[1].log_path(spec).read_bytes() == ref
    assert cluster.nodes[2].log_path(spec).read_bytes() == ref


def test_exit_codes_and_signals_are_reported(cluster: Cluster) -> None:
    job = Job.launch("job", [(cluster.spec(["sh", "-c", "echo bye; exit 7"]), cluster.nodes[0])], cluster.store)
    [status] = job.wait(30)
    assert (status.code, status.signal) == (7, None)
    spec = cluster.spec(["sh", "-c", "echo started; exec sleep 600"], job_id="sleeper")
    job = Job.launch("sleeper", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), "^started$")
    [_init, child] = job.ranks[0].pids()
    os.kill(child, 9)  # killed from outside Tidal
    [status] = job.wait(30)
    assert (status.code, status.signal) == (None, 9)


def test_checkpoint_files_are_owner_only(cluster: Cluster) -> None:
    spec = cluster.spec(LOOP)
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 5$")
    job.checkpoint(then="kill")
    checked = 0
    for top in (cluster.root / "store", cluster.nodes[0].root):
        for dirpath, _dirnames, filenames in os.walk(top):
            assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
            for f in filenames:
                mode = stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode)
                assert mode == 0o600, (os.path.join(dirpath, f), oct(mode))
                checked += 1
    assert checked > 10


FLOOD = ["python3", "-c",
         "import sys, time\nfor i in range(200000):\n    sys.stdout.write(f'line {i} ' + 'x' * 60 + '\\n')\n"
         "    if i % 4000 == 0:\n        sys.stdout.flush(); time.sleep(0.02)\n"]


def test_heavy_output_is_exact_across_checkpoints(cluster: Cluster) -> None:
    """Output written as fast as the pipe takes it: nothing lost or repeated across five restores."""
    spec = cluster.spec(FLOOD)
    ref = reference_run(FLOOD, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    for i, line in enumerate((20000, 60000, 100000, 140000, 180000)):
        wait_for_line(job.ranks[0].node.log_path(spec), rf"^line {line} ")
        job.checkpoint(then="kill")
        job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[(i + 1) % 3])])
    assert [s.code for s in job.wait(120)] == [0]
    assert job.ranks[0].node.log_path(spec).read_bytes() == ref
