"""The `tidal` command run as a user runs it (a subprocess), against a real control plane: the API served over
HTTP by uvicorn, on SQLite, driven by scripted agents (no CRIU, no ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidal.testing.control import Plane
from tidal.testing.server import served


@dataclass
class Served:
    plane: Plane
    url: str
    env: dict[str, str]

    def cli(self, *args: str, env: dict[str, str] | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=True, text=True,
                           env={**self.env, **(env or {})}, timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise AssertionError(f"tidal {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p


def cli_env(home: Path) -> dict[str, str]:
    """A user's environment with nothing of this machine's Tidal settings: no config file, no colour forced."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIDAL_") and k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TERM")}
    return {**env, "TIDAL_HOME": str(home / "tidal-home"), "XDG_CONFIG_HOME": str(home / "config"),
            "HOME": str(home)}


@pytest.fixture
def served_plane(tmp_path: Path) -> Iterator[Served]:
    plane = Plane(tmp_path)
    try:
        with served(plane.http.app) as url:
            yield Served(plane, url, {**cli_env(tmp_path), "TIDAL_URL": url, "TIDAL_TOKEN": plane.user})
    finally:
        plane.db.close()
