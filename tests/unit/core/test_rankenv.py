from __future__ import annotations

import pytest

from tidal.core.rankenv import torchrun_env
from tidal.errors import ValidationError


def test_a_rank_on_the_second_node_of_a_job() -> None:
    env = torchrun_env(rank=2, local_rank=0, world_size=3, local_world_size=1, group_rank=1, group_world_size=2,
                       master_addr="10.0.0.1", master_port=29500, run_id="j-1", user_env={})
    assert env == {
        "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_RANK": "2", "ROLE_WORLD_SIZE": "3",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "j-1",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_omp_threads_as_torchrun_sets_them() -> None:
    two = dict(rank=0, local_rank=0, world_size=2, local_world_size=2, group_rank=0, group_world_size=1,
               master_addr="127.0.0.1", master_port=1, run_id="j")
    assert torchrun_env(**two)["OMP_NUM_THREADS"] == "1"  # type: ignore[arg-type]
    assert "OMP_NUM_THREADS" not in torchrun_env(**two, user_env={"OMP_NUM_THREADS": "4"})  # type: ignore[arg-type]


def test_a_rank_outside_its_world_is_refused() -> None:
    with pytest.raises(ValidationError) as err:
        torchrun_env(rank=3, local_rank=0, world_size=3, local_world_size=1, group_rank=0, group_world_size=1,
                     master_addr="h", master_port=1, run_id="j")
    assert err.value.message == "rank 3 (local 0) does not fit a world of 3 with 1 on its node"
