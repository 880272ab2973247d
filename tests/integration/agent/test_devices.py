"""Virtual devices: CPU sets when cores suffice, else a cgroup CPU quota per device that a rank keeps
across checkpoint and restore on another node root."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tidal.agent.devices import CpuQuota, cpu_sets
from tidal.errors import ConfigError
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec, become_subreaper
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing import wait_until


def test_cpu_sets() -> None:
    assert cpu_sets(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert cpu_sets(1, [0, 1]) == [[0, 1]]
    assert cpu_sets(4, [0, 1]) == [[0], [1], [0], [1]]
    with pytest.raises(ConfigError):
        cpu_sets(0)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child(job: Job) -> int:
    """The rank's command (its init forks it right after launch: wait for it)."""
    kids = wait_until(lambda: [p for p in job.ranks[0].pids() if p != job.ranks[0].pid], timeout=10,
                      what="the rank's command to start", interval=0.01)
    return kids[0]


@pytest.mark.criu
def test_quota_limits_a_rank_and_survives_restore(tmp_path: Path) -> None:
    become_subreaper()
    quota = CpuQuota(f"qtest-{os.getpid()}", devices=4, cores=1)  # a quarter of a CPU per device
    if not quota.enabled:
        pytest.skip("no cgroup cpu controller for Tidal here")
    work = tmp_path / "work"
    work.mkdir()
    store = CheckpointStore(str(tmp_path / "store"))
    spec = RankSpec("q", 0, ("sh", "-c", "while :; do :; done"), work, dict(os.environ), cpus=(0,))
    job = Job.launch("q", [(spec, NodeRoot("a", tmp_path / "a"))], store)
    try:
        quota.place(2, job.ranks[0])
        busy = _child(job)
        assert "tidal-devices" in Path(f"/proc/{busy}/cgroup").read_text()
        c0, t0 = _cpu_seconds(busy), time.monotonic()
        time.sleep(1.0)
        share = (_cpu_seconds(busy) - c0) / (time.monotonic() - t0)
        assert share < 0.4, share  # ≈ 0.25 of a CPU, not a whole one
        job.checkpoint("kill")
        job = Job.restore(store, "q", [(spec, NodeRoot("b", tmp_path / "b"))])
        quota.place(2, job.ranks[0])
        busy = _child(job)
        assert "dev2" in Path(f"/proc/{busy}/cgroup").read_text()
    finally:
        job.kill()
        for i in range(4):
            # A device's cgroup can be removed (rmdir raises until then) once the killed rank has left it.
            cgroup = quota.path(i)
            wait_until(lambda c=cgroup: c.rmdir() is None, timeout=5, what=f"{cgroup} to be removable")
        quota.base.rmdir()


@pytest.mark.criu
def test_a_new_agent_kills_ranks_left_frozen_by_a_dead_one(tmp_path: Path) -> None:
    """A rank frozen for a dump when its agent died cannot die on its own: the next agent reaps it."""
    from tidal.agent.fencing import reap_leftovers

    become_subreaper()
    work = tmp_path / "work"
    work.mkdir()
    node = f"fence-{os.getpid()}"
    spec = RankSpec("f", 0, ("sh", "-c", "while :; do sleep 0.01; done"), work, dict(os.environ))
    job = Job.launch("f", [(spec, NodeRoot(node, tmp_path / "n"))], CheckpointStore(str(tmp_path / "store")))
    rank = job.ranks[0]
    busy = _child(job)
    rank.cgroup.freeze()
    killed = reap_leftovers(node)
    assert rank.pid in killed and busy in killed, (rank.pid, busy, killed)
    rank.wait(10)
    # Killed is not yet gone: on a loaded machine the command may still be exiting when its init has been reaped.
    wait_until(lambda: _state(busy) in ("gone", "Z", "X"), timeout=10, what=f"the rank's command ({busy}) to die")
    assert reap_leftovers(node) == []


def _state(pid: int) -> str:
    """A process's state letter, or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
