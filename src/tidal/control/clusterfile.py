"""The local cluster's state file (``TIDAL_HOME/cluster.json``): where the control plane listens and which
processes make up the cluster. Light on imports: every CLI command reads it."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Proc:
    pid: int
    argv: list[str]
    log: str


@dataclass
class ClusterState:
    url: str
    port: int
    server: Proc
    agents: dict[str, Proc] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "port": self.port, "server": vars(self.server),
                "agents": {n: vars(p) for n, p in self.agents.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterState:
        return cls(d["url"], d["port"], Proc(**d["server"]), {n: Proc(**p) for n, p in d["agents"].items()})


def state_path(home: Path) -> Path:
    return home / "cluster.json"


def token_path(home: Path, who: str) -> Path:
    return home / "tokens" / f"{who}.token"


def load(home: Path) -> ClusterState | None:
    p = state_path(home)
    return ClusterState.from_json(json.loads(p.read_text())) if p.exists() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours (tests start clusters in-process) is dead for our purpose.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            return False
    return True
