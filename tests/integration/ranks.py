"""Nodes and a checkpoint store for tests that run real ranks under CRIU (the ``cluster`` fixture), the
example training script, and the uninterrupted run a job's output is compared with."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tidal.mechanisms.criu.rank import NodeRoot, RankSpec
from tidal.mechanisms.storage import CheckpointStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Cluster:
    root: Path
    workdir: Path
    store: CheckpointStore
    nodes: list[NodeRoot]

    def spec(self, argv: list[str], job_id: str = "job", rank: int = 0, **kw: object) -> RankSpec:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV"))}
        return RankSpec(job_id, rank, tuple(argv), self.workdir, env, **kw)  # type: ignore[arg-type]


def reference_run(argv: list[str], workdir: Path, env: dict[str, str]) -> bytes:
    """The uninterrupted run: the same command, same environment, no Tidal."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=300, check=True)
    return out.stdout


def train_argv(*extra: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / "train.py"), *extra]
