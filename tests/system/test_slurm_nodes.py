"""A Slurm step over several nodes: three test hosts (one ``slurmd`` in each host's network namespace, reached
over the test net), a 2-node, 4-rank step (``srun --ntasks-per-node 1 tidal run --ranks-per-node 2``)
preempted by a job that takes one of its nodes, requeued by Slurm onto another pair of nodes, and finished:
every rank's output and the final parameters identical to plain ``torchrun`` on the same script. Two
scripts: DDP (the world group), and a 4-stage pipeline, whose point-to-point ops between the two nodes make
the cut over the tasks run park rounds (docs/distributed.md, "Over several nodes")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.system.test_slurm import TIDAL, _env, _explain
from tidal.mechanisms.criu.provision import find_criu
from tidal.testing import WaitTimeout
from tidal.testing.hosts import TestNet
from tidal.testing.slurm import SlurmCluster, SlurmNode, missing_binaries
from tidal.testing.torchrun import torchrun
from tidal.waiting import wait_for_line, wait_until

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 160
# Per script: its file, its arguments, the files of final parameters it writes.
WORKLOADS = {
    "ddp": ("ddp_train.py", [], ["params.bin"]),
    "pipeline": ("parallel_train.py", ["--mode", "pipeline"], [f"params-{r}.bin" for r in range(4)]),
}


def _torchrun(tmp: Path, script: str, args: list[str], params: list[str]) -> tuple[dict[int, bytes], list[bytes]]:
    """Each rank's output and the final parameters under plain torchrun, 4 ranks."""
    ref = tmp / "reference"
    ref.mkdir()
    (ref / script).write_bytes((EXAMPLES / script).read_bytes())
    run = torchrun([script, *args, "--steps", str(STEPS)], nproc=4, cwd=ref,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return {r: run.stdout(r).encode() for r in range(4)}, [(ref / f).read_bytes() for f in params]


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("test_net", [["n1", "n2", "n3"]], indirect=True)
def test_two_node_step_preempted_and_requeued_onto_other_nodes_is_identical_to_torchrun(
        test_net: TestNet, tmp_path: Path, workload: str) -> None:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): run `make slurm` as root")
    pytest.importorskip("torch")
    find_criu()  # no skip: `make test` provisions CRIU
    script_name, args, params = WORKLOADS[workload]
    want, want_params = _torchrun(tmp_path, script_name, args, params)
    nodes = [SlurmNode(h.name, addr=h.addr, netns=h.netns, cpus=2) for h in test_net.hosts]
    # A GraceTime: at preemption Slurm signals the step's tasks (tidal run) at once, and the batch script (srun,
    # which would kill the tasks on SIGTERM) only when it is over; the step ends long before, checkpointed.
    with SlurmCluster(nodes, ctld_addr=test_net.gateway, grace=120) as slurm:
        d = tmp_path / "job"
        d.mkdir()
        (d / script_name).write_bytes((EXAMPLES / script_name).read_bytes())
        script = d / "job.sh"
        # gloo on the hosts' network (every host also has the machine's hostname).
        script.write_text("#!/bin/sh\nexport OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0\n"
                          f"exec srun --ntasks-per-node=1 {TIDAL} run --ranks-per-node 2 -- {sys.executable} "
                          f"{script_name} {' '.join(args)} --steps {STEPS} --step-time 0.05\n")
        job = slurm.sbatch(script, "-N2", "-p", "low", "--requeue", "--output", str(d / "out.txt"), "--error",
                           str(d / "err.txt"), "--open-mode=append", cwd=d, env=_env(tmp_path))
        try:
            wait_for_line(d / "out.txt", r"^rank 3 step 20 ", timeout=180)
            first = slurm.job(job)
            assert first["NodeList"] == "n[1-2]", first
            # A higher partition's job on n1 preempts the step; while it holds n1, Slurm can start the step
            # again only on n2 and n3: ranks 0-1 move from n1 to n2, ranks 2-3 from n2 to n3.
            gate = d / "gate"
            hog_script = d / "hog.sh"
            hog_script.write_text(f"#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.2; done\n")
            hog = slurm.sbatch(hog_script, "-p", "high", "-w", "n1", "--output", "/dev/null", cwd=d,
                               env=_env(tmp_path))
            wait_until(lambda: slurm.job(job).get("Restarts") == "1" and slurm.job(job).get("JobState") == "RUNNING",
                       timeout=240, what=f"job {job} to be requeued and running again", interval=0.5)
            second = slurm.job(job)
            assert second["NodeList"] == "n[2-3]", second
            wait_until(lambda: "restored from checkpoint" in (d / "err.txt").read_text(), timeout=120,
                       what="the step to be restored")
            gate.touch()
            info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=300)
            slurm.wait_state(hog, ["COMPLETED", "FAILED", "CANCELLED"], timeout=60)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n{_explain(slurm, d)}") from None
        err = (d / "err.txt").read_text()
        assert info["JobState"] == "COMPLETED", _explain(slurm, d)
        assert info["Restarts"] == "1", _explain(slurm, d)
        assert "SIGTERM: checkpoint" in err and "committed (2 tasks)" in err, err
        assert "restored from checkpoint" in err and "on 2 nodes (n2, n3)" in err, err
        got = (d / "out.txt").read_bytes().splitlines(keepends=True)
        for rank in range(4):
            mine = b"".join(ln for ln in got if ln.startswith(f"rank {rank} ".encode()))
            assert mine == want[rank], f"rank {rank}\n{_explain(slurm, d)}"
        assert [(d / f).read_bytes() for f in params] == want_params
        # Done: the step's checkpoints and its coordinator's record are gone from the store.
        store = tmp_path / "store"
        assert not list((store / "jobs").glob(f"{job}*")), sorted(p.name for p in (store / "jobs").iterdir())
        assert not list(store.glob(f"steps/{job}/*.json"))
