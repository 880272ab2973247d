"""A Slurm cluster over two test hosts (one slurmd in each host's network namespace, reached over the test net):
a step's tasks run one per host, and `tidal run`, which does not span several tasks yet (docs/slurm.md,
Limits), says so from each task while nothing runs. A module of its own: it runs when test_slurm.py's
clusters (and its 3-minute job's, which runs beside that module's tests) are gone."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.system.test_slurm import TIDAL, _env, _explain, _workdir
from tidal.testing import WaitTimeout
from tidal.testing.hosts import TestNet
from tidal.testing.slurm import SlurmCluster, SlurmNode, missing_binaries

pytestmark = [pytest.mark.criu, pytest.mark.slow]


@pytest.mark.parametrize("test_net", [["n1", "n2"]], indirect=True)
def test_a_step_over_two_nodes_is_refused_clearly(test_net: TestNet, tmp_path: Path) -> None:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): run `make slurm` as root")
    nodes = [SlurmNode(h.name, addr=h.addr, netns=h.netns, cpus=2) for h in test_net.hosts]
    with SlurmCluster(nodes, ctld_addr=test_net.gateway, grace=0) as slurm:
        where = slurm.client("srun", "-N2", "--ntasks-per-node=1", "--label", "sh", "-c",
                             "ip -4 -o addr show eth0").stdout
        for task, host in enumerate(test_net.hosts):
            assert re.search(rf"^{task}: .* inet {re.escape(host.addr)}/", where, re.M), where
        d = _workdir(tmp_path, "job")
        script = d / "job.sh"
        script.write_text(f"#!/bin/sh\nexec srun --ntasks-per-node=1 {TIDAL} run --ranks-per-node 2 -- "
                          f"{sys.executable} train.py 5 0\n")
        job = slurm.sbatch(script, "-N2", "--output", str(d / "out.txt"), "--error", str(d / "err.txt"), cwd=d,
                           env=_env(tmp_path))
        try:
            info = slurm.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=60)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n{_explain(slurm, d)}") from None
        err = (d / "err.txt").read_text()
        assert info["JobState"] == "FAILED", _explain(slurm, d)
        assert err.count("error: tidal run does not yet span several tasks (this step has 2)") == 2, err
        assert not (d / "out.txt").read_text().strip()
