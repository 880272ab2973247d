"""What `tidal run` reads from Slurm's environment, and the torchrun environment it gives the ranks."""

from __future__ import annotations

import pytest

from tidal.errors import ValidationError
from tidal.mechanisms.slurm.step import SlurmStep, expand_hostlist


@pytest.mark.parametrize(("text", "names"), [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu[08-10],login", ["gpu08", "gpu09", "gpu10", "login"]),
    ("a[1,3-4]b,c[7]", ["a1b", "a3b", "a4b", "c7"]),
])
def test_host_lists(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


def test_bad_host_list() -> None:
    with pytest.raises(ValidationError, match=r"cannot read Slurm's host list 'n\[a-b\]'"):
        expand_hostlist("n[a-b]")


def test_step_from_slurm_environment() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURMD_NODENAME": "n2", "SLURM_RESTART_COUNT": "3"}
    step = SlurmStep.from_env(env)
    assert step == SlurmStep(key="42", job_id="42", task=1, tasks=2, nodes=("n1", "n2"), node="n2", restarts=3)
    assert step.coordinator == "n1"
    assert SlurmStep.from_env(env, key="run-7").key == "run-7"
    assert step.rank_env(1, 2, "198.18.0.2") == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "NODE_RANK": "1", "MASTER_ADDR": "198.18.0.2", "MASTER_PORT": str(step.master_port()),
        "TORCHELASTIC_RESTART_COUNT": "0"}
    # The same port in every task of the step: it comes from the key.
    assert SlurmStep.from_env({**env, "SLURM_PROCID": "0"}).master_port() == step.master_port()


def test_the_step_nodelist_wins_over_the_job_nodelist() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_STEP_NODELIST": "n[3-4]"}
    assert SlurmStep.from_env(env).nodes == ("n3", "n4")


@pytest.mark.parametrize(("env", "key", "message"), [
    ({}, None, "tidal run needs a key for its checkpoints: it is not inside a Slurm job (SLURM_JOB_ID is unset) "
               "and no --key was given"),
    ({"SLURM_JOB_ID": "1"}, "../etc", "checkpoint key '../etc' must be 1-128 letters, digits, '.', '_' or '-'"),
    ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "x"}, None, "SLURM_NTASKS='x' is not a number"),
    ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "2"}, None,
     "SLURM_PROCID=2 is not one of the step's 2 tasks"),
])
def test_bad_environment(env: dict[str, str], key: str | None, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        SlurmStep.from_env(env, key)
    assert err.value.message == message
