"""A job whose disjoint sub-groups, 2-D mesh and point-to-point operations cross machines: real agents on
test hosts (:mod:`tidal.testing.hosts`), as in test_multihost_ddp.py. Its four ranks run on two hosts, so
every checkpoint is cut per communicator through the control plane's steps; it is checkpointed while it runs,
migrated whole to the two other hosts, then one rank to a third host, and every rank's step lines equal
plain ``torchrun``'s (run on this machine: placement does not change what gloo computes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.system.cluster import free_port, rank_lines
from tidal.testing import wait_until
from tidal.testing.hostcluster import HostCluster
from tidal.testing.hosts import TestNet

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[1] / "integration" / "mechanisms" / "interpose" / "scripts" / "dist_groups.py"
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
NODES = ["n1", "n2", "n3", "n4"]
WORLD, STEPS, HELD = 4, 300, 290


def _nodes(j: dict[str, Any]) -> list[str]:
    return [p["node"] for p in sorted(j["placement"], key=lambda p: p["rank"])]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("test_net", [["cp", "db", "s3", *NODES]], indirect=True)
def test_subgroups_and_p2p_over_two_hosts_checkpointed_and_migrated_are_identical_to_torchrun(
        test_net: TestNet, tmp_path: Path) -> None:
    net = test_net
    gate, opened = net.shared / "gate", tmp_path / "open"
    opened.touch()

    def args(g: Path) -> list[str]:
        return ["--steps", str(STEPS), "--step-time", "0.25", "--gate", f"{g}:{HELD}"]

    ref = tmp_path / "ref"
    ref.mkdir()
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port",
         str(free_port()), "--log-dir", str(ref / "logs"), "--redirects", "3", str(SCRIPT), *args(opened)],
        cwd=ref, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    c = HostCluster(net, nodes=NODES, devices=2)
    work = net.shared / "work"
    work.mkdir()
    job = c.submit([sys.executable, str(SCRIPT), *args(gate)], cwd=work,
                   options=["--ranks", str(WORLD), "--checkpoint-every", "5s",
                            *(f for k, v in ENV.items() for f in ("--env", f"{k}={v}"))])
    j = c.wait_state(job, "running")
    first = _nodes(j)
    # Ranks 0, 1 on one host and 2, 3 on another: [0, 2], [1, 3] and the ring of sends cross them.
    assert len(set(first)) == 2 and first[0] == first[1] and first[2] == first[3], (first, c.diagnostics())

    def steps() -> int:
        return len(rank_lines(c.cli("logs", job, "--rank", "0").stdout))

    # A checkpoint the job goes on from, a part per host.
    wait_until(lambda: any(len(k["parts"]) == 2 for k in c.job(job)["checkpoints"]), timeout=180,
               what="a periodic checkpoint over both hosts")
    assert c.job(job)["attempt"] == j["attempt"]
    c.cli("migrate", job, timeout=300)
    j = c.wait_state(job, "running")
    second = _nodes(j)
    assert set(second) == set(NODES) - set(first), (first, second, c.diagnostics())
    c.cli("migrate", job, "--rank", "2", "--to", first[0], timeout=300)
    j = c.wait_state(job, "running")
    assert _nodes(j)[2] == first[0] and len(set(_nodes(j))) == 3, (_nodes(j), c.diagnostics())
    assert steps() < HELD, "the job reached its gate before the operations: slow it down"
    gate.touch()
    assert c.cli("wait", job, check=False, timeout=300).returncode == 0, c.diagnostics()
    _, err = torchrun.communicate(timeout=300)
    assert torchrun.returncode == 0, err.decode()[-2000:]
    j = c.job(job)
    assert j["state"] == "succeeded"
    assert not [e for e in j["events"] if "checkpoint failed" in e["detail"]], j["events"]
    for r in range(WORLD):
        (log,) = (ref / "logs").glob(f"*/attempt_0/{r}/stdout.log")
        assert rank_lines(c.cli("logs", job, "--rank", str(r)).stdout) == rank_lines(log.read_text()), r
