"""A DDP job across machines: real agents on test hosts (:mod:`tidal.testing.hosts`), the control plane on
PostgreSQL with TLS, checkpoints in SeaweedFS (:class:`tidal.testing.hostcluster.HostCluster`). Its four
ranks run on two hosts, as under ``torchrun --nnodes 2 --nproc-per-node 2`` on those hosts; mid-run it is
migrated whole to the two other hosts, then its rank 0 alone to a host it no longer runs on, and every
rank's per-step output and the final parameters stay byte-identical to that torchrun run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tidal.testing import pid_alive, wait_until
from tidal.testing.hostcluster import STORE_PREFIX, HostCluster
from tidal.testing.hosts import Host, TestNet
from tidal.testing.torchrun import TorchRun

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
DDP = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
# The same math as the reference whatever a host's cores; gloo on the hosts' network, not on the address
# of the machine's hostname (every host has it).
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}
NODES = ["n1", "n2", "n3", "n4"]
WORLD, PER_NODE = 4, 2
MASTER_PORT = 29500  # each host has a network of its own: nothing else holds it there


def _steps(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("rank ")]


def torchrun(hosts: list[Host], ref: Path, args: list[str]) -> tuple[dict[int, list[str]], bytes]:
    """Each rank's step lines and the final parameters under plain torchrun, one agent per host in
    ``hosts`` (static rendezvous on the first one's address)."""
    ref.mkdir()
    runs = [TorchRun([str(DDP), *args], nproc=PER_NODE, cwd=ref, logs=ref / f"logs-{i}", env={**os.environ, **ENV},
                     options=["--nnodes", str(len(hosts)), "--node-rank", str(i), "--master-addr", hosts[0].addr,
                              "--master-port", str(MASTER_PORT)], first_rank=i * PER_NODE, popen=host.popen)
            for i, host in enumerate(hosts)]
    for run in runs:
        run.wait(300)
    steps = {run.first_rank + local: _steps(run.stdout(local)) for run in runs for local in range(PER_NODE)}
    return steps, (ref / "params.bin").read_bytes()


def _nodes(j: dict[str, Any]) -> list[str]:
    return [p["node"] for p in sorted(j["placement"], key=lambda p: p["rank"])]


def _pids(j: dict[str, Any]) -> list[int]:
    return [int(p["pid"]) for p in j["placement"]]


def _user_pid(init_pid: int) -> int:
    """The rank's command: the child of its init."""
    return int(Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()[0])


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().partition("=")[::2] for kv in raw if kv)


def _rank_lines(c: HostCluster, job: str) -> dict[int, list[str]]:
    return {r: _steps(c.cli("logs", job, "--rank", str(r)).stdout) for r in range(WORLD)}


def _steps_done(c: HostCluster, job: str) -> int:
    return len(_steps(c.cli("logs", job, "--rank", "0").stdout))


def _in_s3(c: HostCluster, job: str) -> set[str]:
    """The store checkpoints of ``job`` committed in the S3 bucket (those with a manifest)."""
    pages = c.s3.client().get_paginator("list_objects_v2").paginate(
        Bucket=c.s3.bucket, Prefix=f"{STORE_PREFIX}/jobs/{job}/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    return {k.split("/")[-2] for k in keys if k.endswith("/manifest.json")}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("test_net", [["cp", "db", "s3", *NODES]], indirect=True)
def test_ddp_over_two_hosts_migrated_whole_and_by_rank_is_identical_to_torchrun(test_net: TestNet) -> None:
    net = test_net
    held = 36
    gate = net.shared / "gate"
    args = ["--steps", "40", "--step-time", "0.1", "--collectives", "--gate", f"{gate}:{held}"]

    c = HostCluster(net, nodes=NODES, devices=PER_NODE)
    work = net.shared / "work"
    work.mkdir()
    job = c.submit([sys.executable, str(DDP), *args], cwd=work,
                   options=["--ranks", str(WORLD), *(f for k, v in ENV.items() for f in ("--env", f"{k}={v}"))])
    j = c.wait_state(job, "running")
    running = c.running_on(job)
    first = _nodes(j)
    # Larger than any node (2 devices): contiguous ranks together on two hosts.
    assert len(set(first)) == 2 and first[0] == first[1] and first[2] == first[3], (first, c.diagnostics())
    # As torchrun sets it: rank 0's host's address (the one its agent advertises), on every host.
    for r in (0, WORLD - 1):
        env = _environ(_user_pid(running[r][1]))
        assert env["MASTER_ADDR"] == net[first[0]].addr, (r, env.get("MASTER_ADDR"), c.diagnostics())
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == str(WORLD)
    wait_until(lambda: _steps_done(c, job) >= 3, timeout=120, what="first steps")

    # Mid-run, every rank to the two other hosts: checkpointed to S3, restored there.
    before = c.job(job)
    users = [_user_pid(p) for p in _pids(before)]
    c.cli("migrate", job, timeout=300)
    j = c.wait_state(job, "running")
    second = _nodes(j)
    assert set(second) == set(NODES) - set(first), (first, second, c.diagnostics())
    assert second[0] == second[1] and second[2] == second[3] and j["attempt"] == before["attempt"] + 1
    wait_until(lambda: not any(pid_alive(p) for p in [*_pids(before), *users]), timeout=30,
               what="the old ranks to end")
    cks = c.job(job)["checkpoints"]
    assert cks and set(cks[-1]["parts"]) <= _in_s3(c, job), (cks, _in_s3(c, job))

    # One rank to a host the job does not run on (it then spans three): rank 0, whose host keeps the
    # working directory.
    before = c.job(job)
    c.cli("migrate", job, "--rank", "0", "--to", first[0], timeout=300)
    j = c.wait_state(job, "running")
    third = _nodes(j)
    assert third == [first[0], *second[1:]], (third, c.diagnostics())
    assert j["attempt"] == before["attempt"] + 1
    wait_until(lambda: not any(pid_alive(p) for p in _pids(before)), timeout=30, what="the old ranks to end")
    cks = c.job(job)["checkpoints"]
    assert len(cks) >= 2 and set(cks[-1]["parts"]) <= _in_s3(c, job), (cks, _in_s3(c, job))
    assert len(cks[-1]["parts"]) == 2  # one store checkpoint per host the job spanned when it was taken

    # The reference, on the same two hosts, while the job waits at its gate (the reference has its own,
    # open one: where the script waits changes nothing it computes).
    ref_gate = net.shared / "ref-gate"
    ref_gate.touch()
    expected, params = torchrun([net[first[0]], net[first[2]]], net.shared / "torchrun",
                                [*args[:-1], f"{ref_gate}:{held}"])
    assert [expected[r][-1] for r in range(WORLD)] == [f"rank {r} done, world {WORLD}" for r in range(WORLD)]

    gate.touch()
    assert c.cli("wait", job, check=False, timeout=300).returncode == 0, c.diagnostics()
    assert c.job(job)["state"] == "succeeded"
    assert _rank_lines(c, job) == expected, c.diagnostics()
    assert (work / "params.bin").read_bytes() == params
