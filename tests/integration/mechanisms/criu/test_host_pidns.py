"""Ranks in the host's PID namespace (how GPU ranks run: CUDA cannot start in a PID namespace without a
/proc of its own): checkpointed going on and killed, restored on another node root with their PIDs, output
and parameters byte-identical to an uninterrupted run; a kill leaves no process of the rank behind; a DDP
job of two such ranks is cut and restored identical to ``torchrun``."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace

import pytest

from tests.integration.mechanisms.interpose.test_interpose import (  # noqa: F401  (fixtures)
    StartRef,
    ddp_argv,
    log,
    prefix,
    rank_specs,
    rendezvous,
    torchrun,
    wait_step,
)
from tests.integration.ranks import Cluster, reference_run, train_argv
from tidal.mechanisms.criu import tasks
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.interpose.channel import Store
from tidal.mechanisms.interpose.storeserver import RendezvousServer
from tidal.testing import wait_for_line

pytestmark = [pytest.mark.torch, pytest.mark.criu, pytest.mark.slow]


def test_rank_in_the_host_pid_namespace_checkpointed_and_restored_with_its_pids(cluster: Cluster) -> None:
    argv = train_argv("--steps", "300", "--workers", "2", "--step-time", "0.02")
    spec = replace(cluster.spec(argv), own_pidns=False)
    assert not spec.pidns and cluster.spec(argv).pidns
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    nodes = cluster.nodes
    job = Job.launch("job", [(spec, nodes[0])], cluster.store)
    path = nodes[0].log_path(spec)
    wait_for_line(path, r"^step 10 ")
    tree = job.ranks[0].pids()
    assert len(tree) >= 4  # init, script, two DataLoader workers
    assert os.readlink(f"/proc/{tree[1]}/ns/pid") == os.readlink("/proc/self/ns/pid")
    job.checkpoint(then="continue")
    wait_for_line(path, r"^step 25 ")
    tree = job.ranks[0].pids()
    job.checkpoint(then="kill")
    assert job.ranks[0].wait(30).signal == signal.SIGKILL
    assert [p for p in tree if tasks.alive(p)] == []  # killed and reaped: the PIDs are free again
    job = Job.restore(cluster.store, "job", [(spec, nodes[1])])
    assert job.ranks[0].pids()[:2] == tree[:2]  # the same PIDs: the script sees no change
    assert [s.code for s in job.wait(300)] == [0]
    assert nodes[1].log_path(spec).read_bytes() == ref
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()


def test_ddp_ranks_in_the_host_pid_namespace_restore_identical_to_torchrun(
        cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef) -> None:  # noqa: F811
    release = cluster.root / "release"
    argv = ddp_argv(100, 0.03, (release, 95))  # the ranks wait at step 95 until released
    ref = torchrun(argv, 2)
    pre = prefix()
    specs = [replace(s, own_pidns=False) for s in rank_specs(cluster, [sys.executable, *argv], 2, rendezvous.addr,
                                                             f"{pre}/1")]
    job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
    wait_step(job, 0, 10)
    job.checkpoint(then="continue")
    wait_step(job, 1, 20)
    job.checkpoint(then="kill")
    job = Job.restore(cluster.store, "job", [(s, cluster.nodes[1]) for s in specs],
                      rendezvous=Store(rendezvous.addr, f"{pre}/2"))
    release.touch()
    assert [s.code for s in job.wait(300)] == [0, 0]
    for r in range(2):
        assert log(job, r).read_bytes() == ref.log(r)
    assert (cluster.workdir / "params.bin").read_bytes() == ref.params
