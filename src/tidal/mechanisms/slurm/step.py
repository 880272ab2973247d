"""What Slurm tells a step's task about itself, and the torchrun environment of the ranks it runs.

Pure: an environment mapping in, a :class:`SlurmStep` and rank environments out."""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from tidal.errors import ValidationError

KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact host list (``n[1-3,7],gpu01``) as names, in order."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", text):
        head, ranges, tail = m.group(1), m.group(2), m.group(3)
        if not head and not ranges:
            continue
        if ranges is None:
            names.append(head + tail)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValidationError(f"cannot read Slurm's host list {text!r}", field="SLURM_JOB_NODELIST",
                                      hint="Slurm sets it; do not set it by hand")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{head}{i:0{width}d}{tail}")
    return names


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValidationError(f"{name}={raw!r} is not a number", field=name,
                              hint="Slurm sets it; run `tidal run` inside a Slurm job (sbatch, srun)") from exc


@dataclass(frozen=True)
class SlurmStep:
    """One ``tidal run`` task of a Slurm step: which of the step's tasks it is and where the others run."""

    key: str  # the checkpoints' key in the store: the job id, or --key
    job_id: str | None  # Slurm's job id (None outside Slurm)
    task: int  # SLURM_PROCID: this task among the step's tasks (one per node for a multi-node step)
    tasks: int  # SLURM_NTASKS
    nodes: tuple[str, ...]  # the step's nodes, in order (task i runs on nodes[i] with one task per node)
    node: str  # the node this task runs on
    restarts: int  # SLURM_RESTART_COUNT: how often Slurm has started the job again

    @classmethod
    def from_env(cls, env: Mapping[str, str], key: str | None = None) -> SlurmStep:
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None
        key = key or job_id
        if not key:
            raise ValidationError("tidal run needs a key for its checkpoints: it is not inside a Slurm job "
                                  "(SLURM_JOB_ID is unset) and no --key was given", field="key",
                                  hint="run it in a batch script submitted with sbatch, or give --key NAME")
        if not KEY_RE.match(key):
            raise ValidationError(f"checkpoint key {key!r} must be 1-128 letters, digits, '.', '_' or '-'",
                                  field="key", hint="give another --key")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        node = env.get("SLURMD_NODENAME") or "localhost"
        nodes = tuple(expand_hostlist(nodelist)) if nodelist else (node,)
        tasks = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
        task = _int(env, "SLURM_PROCID", 0)
        if not 0 <= task < tasks:
            raise ValidationError(f"SLURM_PROCID={task} is not one of the step's {tasks} tasks", field="SLURM_PROCID",
                                  hint="Slurm sets it; run `tidal run` inside a Slurm job (sbatch, srun)")
        return cls(key, job_id, task, tasks, nodes, node, _int(env, "SLURM_RESTART_COUNT", 0))

    @property
    def coordinator(self) -> str:
        """The node of task 0, whose ``tidal run`` hosts the rendezvous and drives the cut."""
        return self.nodes[0]

    def master_port(self) -> int:
        """A port for MASTER_PORT, the same in every task of the step (from the key, as the agent does)."""
        return 20000 + zlib.crc32(self.key.encode()) % 20000

    def rank_env(self, local_rank: int, ranks_per_node: int, master_addr: str) -> dict[str, str]:
        """torchrun's variables of local rank ``local_rank`` of this task's ``ranks_per_node``."""
        world = self.tasks * ranks_per_node
        return {"RANK": str(self.task * ranks_per_node + local_rank), "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(ranks_per_node),
                "GROUP_RANK": str(self.task), "NODE_RANK": str(self.task),
                "MASTER_ADDR": master_addr, "MASTER_PORT": str(self.master_port()),
                "TORCHELASTIC_RESTART_COUNT": "0"}
