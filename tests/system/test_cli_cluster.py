"""`tidal up`, `status`, `nodes`, `down` as a user runs them, and `tidal up` restarting what died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tidal.testing import pid_alive, wait_until

pytestmark = pytest.mark.criu


def _tidal(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDAL_HOME": str(home), "COLUMNS": "200"}
    env.pop("TIDAL_URL", None)
    env.pop("TIDAL_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_up_status_down(tmp_path: Path) -> None:
    home = tmp_path / "home"
    try:
        p = _tidal(home, "up", "--nodes", "3", "--devices-per-node", "2", "--metrics-public")
        assert p.returncode == 0, p.stderr
        assert "started control plane, node-1, node-2, node-3" in p.stdout
        state = json.loads((home / "cluster.json").read_text())
        assert sorted(state["agents"]) == ["node-1", "node-2", "node-3"]
        assert f"dashboard at {state['url']}/ui" in p.stdout
        # --metrics-public: a scrape needs no token (anything else still does)
        assert "tidal_devices 6.0" in httpx.get(f"{state['url']}/metrics", timeout=10).text
        assert httpx.get(f"{state['url']}/v1/jobs", timeout=10).status_code == 401
        nodes = _tidal(home, "nodes").stdout
        rows = [line.split() for line in nodes.splitlines()]
        assert rows[0][:4] == ["NODE", "ADDRESS", "REGION/CLUSTER", "DEVICES"]
        assert [r[0] for r in rows[1:]] == ["node-1", "node-2", "node-3"] and all(r[3] == "2" for r in rows[1:])
        assert "yes" in _tidal(home, "status").stdout
        assert (home / "tokens" / "user.token").stat().st_mode & 0o077 == 0

        # an agent dies: `tidal up` again restarts it (and nothing else)
        victim = state["agents"]["node-2"]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not pid_alive(victim), timeout=30, what="the agent to die")
        status = json.loads(_tidal(home, "status", "-o", "json").stdout)
        assert {p["name"]: p["alive"] for p in status["processes"]} == {
            "control plane": True, "node-1": True, "node-2": False, "node-3": True}
        p = _tidal(home, "up", "--nodes", "3")
        assert p.returncode == 0 and "started node-2" in p.stdout, p.stdout + p.stderr
    finally:
        p = _tidal(home, "down")
    assert p.returncode == 0 and "control plane" in p.stdout
    assert not (home / "cluster.json").exists()
    assert _tidal(home, "status").returncode == 1
    p = _tidal(home, "ls")
    assert p.returncode != 0 and "tidal up" in p.stderr and "Traceback" not in p.stderr
