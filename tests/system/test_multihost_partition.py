"""A host cut off the network while its job runs, on test hosts (control plane on PostgreSQL, checkpoints in
SeaweedFS, TLS): the partitioned agent cannot renew its lease and kills its own ranks before the lease runs
out (fencing); the control plane requeues the job once the lease has expired, and it is restored on another
host from its last checkpoint in S3. When the link comes back, the agent registers again and nothing of the
old incarnation runs: the job's output is exactly that of an uninterrupted run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.system.cluster import JOB, reference_run
from tidal.testing import pid_alive, wait_until
from tidal.testing.hostcluster import HostCluster, tail
from tidal.testing.hosts import TestNet

pytestmark = [pytest.mark.criu, pytest.mark.slow]


def _job_pids(net: TestNet, host: str) -> list[int]:
    """The processes of the test job on ``host`` (the shell loop that writes progress.txt)."""
    out = []
    for pid in net[host].pids():
        try:
            if "progress.txt" in Path(f"/proc/{pid}/cmdline").read_text():
                out.append(pid)
        except OSError:
            continue
    return out


@pytest.mark.parametrize("test_net", [["cp", "db", "s3", "n1", "n2"]], indirect=True)
def test_a_partitioned_host_fences_its_ranks_and_the_job_resumes_elsewhere(test_net: TestNet,
                                                                          tmp_path: Path) -> None:
    lease = 6.0
    c = HostCluster(test_net, nodes=["n1", "n2"], lease=lease)
    expected_out, expected_progress = reference_run(tmp_path)
    work = test_net.shared / "work"
    work.mkdir()
    gate = test_net.shared / "gate"
    job = c.cli("submit", "--env", "GATE", "-q", "--checkpoint-every", "1s", "--max-restarts", "2", "--",
                "sh", "-c", JOB, cwd=work, env={"GATE": str(gate)}).stdout.strip()
    node, pid = c.running_on(job)[0]
    other = "n2" if node == "n1" else "n1"
    wait_until(lambda: len(c.job(job)["checkpoints"]) >= 1, timeout=60, what="a periodic checkpoint")
    c.running_on(job)
    assert _job_pids(test_net, node), "the job runs on its host"

    test_net[node].link_down()
    cut = time.monotonic()
    # The agent cannot renew its lease: it kills its ranks itself, before the lease can have run out.
    wait_until(lambda: not pid_alive(pid), timeout=2 * lease, what="the partitioned host's rank to be fenced")
    fenced_after = time.monotonic() - cut
    assert fenced_after < lease, f"fenced {fenced_after:.1f}s after the cut: the lease ({lease}s) may have run out"
    assert not _job_pids(test_net, node)
    assert f"cannot renew node {node}'s lease" in tail(c.agents[node].log), c.diagnostics()

    # The control plane requeues it once the lease has expired; it is restored on the other host from S3.
    def restored() -> dict[str, object] | None:
        j = c.job(job)
        return j if j["restarts"] == 0 and j["state"] == "running" and not j["busy"] and j["placement"] and \
            j["placement"][0]["node"] == other and j["placement"][0]["pid"] else None

    j = wait_until(restored, timeout=60, what=f"the job to be restored on {other}")
    lost = [e for e in j["events"] if e["kind"] in ("pending", "preempted")][-1]  # type: ignore[union-attr]
    assert "lost" in lost["detail"] and "not counted as a restart" in lost["detail"], lost

    # The link comes back: the agent registers again; nothing of the old incarnation runs.
    test_net[node].link_up()
    c.wait_node_up(node)
    assert not _job_pids(test_net, node)
    assert not pid_alive(pid)

    gate.touch()
    j = c.wait_state(job, "succeeded", "failed", timeout=120)
    assert j["state"] == "succeeded", c.diagnostics()
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (work / "progress.txt").read_bytes() == expected_progress
    assert not _job_pids(test_net, node) and not _job_pids(test_net, other)
