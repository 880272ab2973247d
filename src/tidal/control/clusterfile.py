"""The local cluster's state file (``TIDAL_HOME/cluster.json``): where the control plane listens and which
processes make up the cluster. Light on imports: every CLI command reads it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
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


def tidal_home(environ: Mapping[str, str] | None = None) -> Path:
    """``TIDAL_HOME`` as :class:`tidal.config.Settings` reads it (its name in any case; the default
    ``~/.tidal``), without loading the settings: a command of the CLI needs nothing else of them, and
    pydantic-settings is most of a short command's start-up."""
    env = os.environ if environ is None else environ
    # As pydantic-settings does: the variables' names lower-cased, the last of two that differ in case winning.
    value = {k.lower(): v for k, v in env.items()}.get("tidal_home")
    return Path.home() / ".tidal" if value is None else Path(value)


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
