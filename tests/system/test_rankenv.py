"""What a rank of a Tidal job sees, variable by variable, against a worker of plain ``torchrun``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.core.rankenv import torchrun_env
from tidal.testing import wait_until

pytestmark = [pytest.mark.slow]
PRINT_ENV = Path(__file__).resolve().parents[2] / "examples" / "print_env.py"
# Where Tidal differs on purpose (see tidal.core.rankenv): no agent store, no error file, its own address.
INTENTIONAL = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
               "TORCHELASTIC_RUN_ID"}


def _torchrun_worker_env(tmp_path: Path, world: int) -> dict[int, dict[str, str]]:
    """What torchrun adds to its caller's environment, per worker."""
    base = {"PATH": os.environ["PATH"], "HOME": "/root"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), str(PRINT_ENV)],
                   cwd=tmp_path, env=base, check=True, capture_output=True, timeout=300)
    out = {}
    for r in range(world):
        env = json.loads((tmp_path / f"env-{r}.json").read_text())
        out[r] = {k: v for k, v in env.items() if base.get(k) != v and k != "LC_CTYPE"}
    return out


def test_torchrun_env_matches_a_real_torchrun_worker_but_for_the_listed_differences(tmp_path: Path) -> None:
    real = _torchrun_worker_env(tmp_path, 2)
    for r in range(2):
        ours = torchrun_env(rank=r, local_rank=r, world_size=2, local_world_size=2, group_rank=0,
                            group_world_size=1, master_addr="127.0.0.1", master_port=29500, run_id="j-1")
        assert set(ours) | {"TORCHELASTIC_ERROR_FILE"} == set(real[r]), sorted(set(ours) ^ set(real[r]))
        same = {k: v for k, v in real[r].items() if k not in INTENTIONAL}
        assert {k: ours[k] for k in same} == same
        assert ours["TORCHELASTIC_USE_AGENT_STORE"] == "False" and ours["TORCHELASTIC_RUN_ID"] == "j-1"


@pytest.mark.criu
def test_a_tidal_rank_sees_torchrun_s_environment(make_cluster, tmp_path: Path) -> None:
    # W = 3 on nodes of 2 devices: ranks 0, 1 on the first node, rank 2 alone on the second.
    c = make_cluster(nodes=2, devices=2)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--ranks", "3", "--", sys.executable, str(PRINT_ENV), cwd=work).stdout.strip()
    assert c.cli("wait", job, check=False, timeout=300).returncode == 0
    seen = {r: json.loads(c.cli("logs", job, "--rank", str(r)).stdout.strip().splitlines()[-1]) for r in range(3)}
    for r, (local, lws, group) in enumerate([(0, 2, 0), (1, 2, 0), (0, 1, 1)]):
        env = seen[r]
        want = torchrun_env(rank=r, local_rank=local, world_size=3, local_world_size=lws, group_rank=group,
                            group_world_size=2, master_addr=env["MASTER_ADDR"], master_port=int(env["MASTER_PORT"]),
                            run_id=job)
        assert {k: env.get(k) for k in want} == want, r


TORCHRUN_ONLY = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID"}


@pytest.mark.criu
def test_without_ranks_a_job_sees_plain_python_s_environment_and_ranks_1_torchrun_s(make_cluster,
                                                                                    tmp_path: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    seen = {}
    for how, extra in (("plain", []), ("ranks 1", ["--ranks", "1"])):
        work = tmp_path / how.replace(" ", "")
        work.mkdir()
        job = c.cli("submit", "-q", *extra, "--", sys.executable, str(PRINT_ENV), cwd=work).stdout.strip()
        assert c.cli("wait", job, check=False, timeout=300).returncode == 0
        seen[how] = (job, json.loads(c.cli("logs", job).stdout.strip().splitlines()[-1]))
    _, plain = seen["plain"]
    assert not TORCHRUN_ONLY & set(plain), sorted(TORCHRUN_ONLY & set(plain))
    job, one = seen["ranks 1"]
    assert {k: one.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                    "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID")} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": job}


PRINT_GROUPS = PRINT_ENV.with_name("print_groups.py")


def _lines(work: Path, world: int) -> dict[int, list[dict[str, object]]]:
    return {r: [json.loads(x) for x in (work / f"groups-{r}.jsonl").read_text().splitlines()] for r in range(world)}


@pytest.mark.criu
def test_a_tidal_rank_sees_torchrun_s_process_groups_before_and_after_a_checkpoint_and_a_migration(
        make_cluster, tmp_path: Path) -> None:
    # get_backend(), the group's name and device types: DCP's async_save, set_model_state_dict's
    # broadcast_from_rank0 and the object collectives choose a device by them.
    real = tmp_path / "torchrun"
    real.mkdir()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(PRINT_GROUPS)],
                   cwd=real, check=True, capture_output=True, timeout=300)
    want = _lines(real, 2)
    assert [line["phase"] for line in want[0]] == ["start", "after"]
    assert want[0][1]["backend"] == "gloo" and want[0][1]["async_save_read_back"] is True

    c = make_cluster(nodes=2, devices=2)
    work = tmp_path / "tidal"
    work.mkdir()
    gate = work / "gate"
    job = c.cli("submit", "-q", "--ranks", "2", "--", sys.executable, str(PRINT_GROUPS), "--gate", str(gate),
                cwd=work).stdout.strip()

    def started() -> bool | None:
        if all((work / f"groups-{r}.jsonl").exists() for r in range(2)):
            return True
        state = c.job(job)["state"]
        assert state not in ("succeeded", "failed", "cancelled"), (state, c.cli("logs", job).stdout)
        return None

    wait_until(started, timeout=120, what="both ranks' first line")
    c.cli("preempt", job, timeout=300)
    c.cli("resume", job, timeout=300)
    c.wait_state(job, "running", timeout=300)
    c.move_rank(job, 1, "node-2", otherwise="node-1")
    gate.touch()
    assert c.cli("wait", job, check=False, timeout=300).returncode == 0, c.cli("logs", job).stdout
    assert _lines(work, 2) == want


@pytest.mark.criu
@pytest.mark.parametrize("backend", ["none", "cpu:gloo"])
def test_what_torch_says_of_a_tidal_rank_s_groups_follows_the_backend_asked_for(make_cluster, tmp_path: Path,
                                                                                backend: str) -> None:
    # torchrun: no backend gives "undefined" and a CPU config only; "cpu:gloo" gives itself.
    real = tmp_path / "torchrun"
    real.mkdir()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(PRINT_GROUPS),
                    "--backend", backend], cwd=real, check=True, capture_output=True, timeout=300)
    want = _lines(real, 2)
    assert want[0][0]["backend"] == ("undefined" if backend == "none" else backend)
    c = make_cluster(nodes=1, devices=2)
    work = tmp_path / "tidal"
    work.mkdir()
    job = c.cli("submit", "-q", "--ranks", "2", "--", sys.executable, str(PRINT_GROUPS), "--backend", backend,
                cwd=work).stdout.strip()
    assert c.cli("wait", job, check=False, timeout=300).returncode == 0, c.cli("logs", job).stdout
    assert _lines(work, 2) == want
