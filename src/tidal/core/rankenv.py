"""The environment ``torchrun`` gives a worker, for a rank placed by Tidal (pure; also for launchers that
derive a placement from elsewhere, such as a batch system's variables).

Compared with a real ``torchrun`` worker (tests/system/test_rankenv.py checks every variable), the
intentional differences are:

- ``MASTER_ADDR``/``MASTER_PORT``: the node of rank 0 and a port derived from the job, not torchrun's
  ``localhost`` and a free port; no process listens there (the interposer rendezvous on Tidal's store).
- ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``: there is no agent store at ``MASTER_PORT``.
- ``TORCHELASTIC_ERROR_FILE`` is not set: Tidal records a rank's exit itself (``tidal show``).
- ``TORCHELASTIC_RUN_ID`` is the job's id; ``TORCHELASTIC_RESTART_COUNT`` and ``..._MAX_RESTARTS`` are 0:
  a job brought back after a failure is restored from its checkpoint, not restarted, so the script never
  sees a restart.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidal.errors import ValidationError

# What torchrun's local agent sets for every worker and never takes from the caller's environment.
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def torchrun_env(*, rank: int, local_rank: int, world_size: int, local_world_size: int, group_rank: int,
                 group_world_size: int, master_addr: str, master_port: int, run_id: str,
                 user_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables torchrun sets for worker ``rank`` (one role, ``default``): ``group_rank`` is the
    index of the rank's node among the job's nodes (in the order of their first ranks), of
    ``group_world_size`` nodes; ``user_env`` is the job's own environment, which only ``OMP_NUM_THREADS``
    consults (torchrun sets it to 1 for several workers on a node unless the caller set it)."""
    if not 0 <= rank < world_size or not 0 <= local_rank < local_world_size <= world_size:
        raise ValidationError(f"rank {rank} (local {local_rank}) does not fit a world of {world_size} with "
                              f"{local_world_size} on its node", field="rank",
                              hint="0 <= local rank < ranks on the node <= world size, 0 <= rank < world size")
    if not 0 <= group_rank < group_world_size:
        raise ValidationError(f"node index {group_rank} does not fit {group_world_size} node(s)",
                              field="group_rank", hint="0 <= node index < number of nodes")
    env = {
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size), "GROUP_RANK": str(group_rank),
        "GROUP_WORLD_SIZE": str(group_world_size), "ROLE_NAME": "default", "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    if local_world_size > 1 and "OMP_NUM_THREADS" not in (user_env or {}):
        env["OMP_NUM_THREADS"] = "1"
    return env
