"""CPU placement: every thread of every process of a rank runs on its device's CPUs, also after a restore
onto another device; OMP_NUM_THREADS follows the device unless the user set it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.integration.ranks import Cluster, train_argv
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import RankSpec
from tidal.mechanisms.criu.tasks import threads
from tidal.testing import wait_for_line


def _affinities(job: Job) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(t)) for t in threads(job.ranks[0].pids())}


def test_threads_follow_the_device_across_restore(cluster: Cluster) -> None:
    argv = train_argv("--steps", "400", "--workers", "2", "--step-time", "0.01")
    spec = cluster.spec(argv, cpus=(0,))
    assert spec.launch_env()["OMP_NUM_THREADS"] == "1"
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    log = cluster.nodes[0].log_path(spec)
    wait_for_line(log, r"^step 5 ")
    assert len(threads(job.ranks[0].pids())) > 3  # torch threads and DataLoader workers
    assert _affinities(job) == {frozenset({0})}
    job.checkpoint(then="kill")
    moved = RankSpec(spec.job_id, spec.rank, spec.argv, spec.workdir, spec.env, cpus=(1,))
    job = Job.restore(cluster.store, "job", [(moved, cluster.nodes[1])])
    wait_for_line(cluster.nodes[1].log_path(moved), r"^step 10 ")
    assert _affinities(job) == {frozenset({1})}
    job.kill()


def test_user_thread_settings_win() -> None:
    spec = RankSpec("j", 0, ("true",), Path("/"),
                    {"OMP_NUM_THREADS": "7", "PYTHONUNBUFFERED": "0"}, cpus=(0, 1))
    env = spec.launch_env()
    assert (env["OMP_NUM_THREADS"], env["PYTHONUNBUFFERED"]) == ("7", "0")
    assert RankSpec("j", 0, ("true",), spec.workdir, {}, cpus=(0, 1)).launch_env()["OMP_NUM_THREADS"] == "2"
