"""A local cluster as the system tests drive it: through the API and through the CLI run as a subprocess,
as a user does; and the deterministic job most of them run, with its uninterrupted output."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tidal.config import Settings
from tidal.control.clusterfile import ClusterState
from tidal.control.localcluster import up
from tidal.testing import wait_until

# A deterministic job: numbered steps, a file it appends to, and a gate (outside its working directory,
# which a restore rolls back) that holds it at step HOLD until the test lets it finish.
JOB = r"""
i=0
while [ $i -lt 160 ]; do
  i=$((i+1))
  echo "step $i value $(( (i * 7919) % 1009 ))"
  echo "$i" >> progress.txt
  if [ $i -ge 80 ]; then while [ ! -e "$GATE" ]; do sleep 0.05; done; fi
  sleep 0.02
done
echo done
"""


@dataclass
class LiveCluster:
    home: Path
    env: dict[str, str]
    state: ClusterState
    settings: Settings
    user_token: str | None = None  # whose "user" this is: None, the token `tidal up` made

    @property
    def url(self) -> str:
        return self.state.url

    def token(self, who: str = "user") -> str:
        return (self.home / "tokens" / f"{who}.token").read_text().strip()

    def api(self, who: str = "user", token: str | None = None) -> httpx.Client:
        token = token or (self.user_token if who == "user" else None) or self.token(who)
        return httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {token}"})

    def cli(self, *args: str, check: bool = True, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=True, text=True,
                           cwd=cwd, env={**self.env, "COLUMNS": "250", **(env or {})}, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"tidal {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def job(self, job_id: str) -> dict[str, Any]:
        with self.api() as c:
            r = c.get(f"/v1/jobs/{job_id}")
            r.raise_for_status()
            return r.json()  # type: ignore[no-any-return]

    def show(self, job_id: str) -> dict[str, Any]:
        return json.loads(self.cli("show", job_id, "--json").stdout)  # type: ignore[no-any-return]

    def wait_state(self, job_id: str, *states: str, timeout: float = 60.0) -> dict[str, Any]:
        def ok() -> dict[str, Any] | None:
            j = self.job(job_id)
            settled = not j["busy"] and (j["state"] != "running" or all(p["pid"] for p in j["placement"]))
            return j if j["state"] in states and settled else None

        return wait_until(ok, timeout=timeout, what=f"job {job_id} to be {'/'.join(states)}")

    def migrate_rank(self, job_id: str, rank: int, to: str, timeout: float = 300.0) -> None:
        """``tidal migrate JOB --rank R --to NODE``, once the node has a free device: jobs cycling side by side
        hold and free the nodes' devices meanwhile, and a refusal for want of a device is right then."""
        def moved() -> bool | None:
            p = self.cli("migrate", job_id, "--rank", str(rank), "--to", to, check=False, timeout=timeout)
            if p.returncode == 0:
                return True
            if f"node {to} has no free device" in p.stderr:
                return None
            raise AssertionError(f"tidal migrate {job_id} --rank {rank} --to {to} exited {p.returncode}:\n"
                                 f"{p.stdout}\n{p.stderr}")

        wait_until(moved, timeout=timeout, what=f"a free device on {to} for rank {rank} of job {job_id}", interval=1.0)

    def move_rank(self, job_id: str, rank: int, to: str, otherwise: str) -> str:
        """Migrate ``rank`` to node ``to``, or to ``otherwise`` where it runs on ``to`` already; returns the node
        once the job runs with the rank there."""
        if self.job(job_id)["placement"][rank]["node"] == to:
            to = otherwise
        self.migrate_rank(job_id, rank, to)
        placement = self.wait_state(job_id, "running", timeout=300)["placement"]
        assert placement[rank]["node"] == to, placement
        return to

    def become(self, unix_user: str, name: str = "ordinary") -> str:
        """From now on, "user" (the CLI and :meth:`api`) is a new user mapped to ``unix_user``."""
        with self.api("admin") as api:
            r = api.post("/v1/users", json={"name": name, "role": "user", "unix_user": unix_user})
            assert r.status_code == 201, r.text
        self.user_token = r.json()["token"]
        self.env = {**self.env, "TIDAL_TOKEN": self.user_token}
        return self.user_token

    def restart(self) -> list[str]:
        """Start whatever part of the cluster is not running (as `tidal up` does)."""
        self.state, started = up(self.settings)
        return started


def reference_run(tmp_path: Path) -> tuple[bytes, bytes]:
    """The job's output and its progress file from an uninterrupted run, outside Tidal."""
    ref = tmp_path / "reference"
    ref.mkdir()
    gate = tmp_path / "reference-gate"
    gate.touch()
    out = subprocess.run(["sh", "-c", JOB], cwd=ref, env={**os.environ, "GATE": str(gate)},
                         capture_output=True, check=True, timeout=120).stdout
    return out, (ref / "progress.txt").read_bytes()


def free_port() -> int:
    """A TCP port free on loopback now (a torchrun reference's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_lines(text: str) -> list[str]:
    """The lines a rank printed about its steps ("rank ...")."""
    return [ln for ln in text.splitlines() if ln.startswith("rank ")]
