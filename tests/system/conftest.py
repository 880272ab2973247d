"""A real local cluster per test: control plane and agent processes started by `tidal up`'s code, with
real CRIU; the CLI runs as a subprocess, exactly as a user runs it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tidal.config import Settings
from tidal.control.clusterfile import ClusterState, load
from tidal.control.localcluster import down, up
from tidal.mechanisms.criu.provision import find_criu

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


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return not stat.read_text().split(") ")[1].startswith("Z")
    except OSError:
        return False


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

        return wait_for(ok, timeout, f"job {job_id} to be {'/'.join(states)}")  # type: ignore[no-any-return]

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


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveCluster]]:
    find_criu()  # no skip: `make test` provisions CRIU
    made: list[LiveCluster] = []

    def make(nodes: int = 2, devices: int = 1, lease: float = 3.0, database_url: str | None = None,
             home: Path | None = None, policy: str | None = None, quotas: str | None = None,
             checkpoint_store: str | None = None) -> LiveCluster:
        home = home or tmp_path_factory.mktemp("tidal-home")
        env = {**os.environ, "TIDAL_HOME": str(home)}
        env.pop("TIDAL_URL", None)
        env.pop("TIDAL_TOKEN", None)
        if database_url:
            env["TIDAL_DATABASE_URL"] = database_url
        if checkpoint_store:
            env["TIDAL_CHECKPOINT_STORE"] = checkpoint_store
        settings = Settings(home=home, database_url=database_url, quotas=quotas,
                            **({"checkpoint_store": checkpoint_store} if checkpoint_store else {}))
        st, _ = up(settings, nodes=nodes, devices_per_node=devices, lease_s=lease,
                   **({"policy": policy} if policy else {}))
        c = LiveCluster(home, env, st, settings)
        made.append(c)
        return c

    yield make
    for c in made:
        down(c.settings)
        latest = load(c.home)
        assert latest is None


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every account may traverse (pytest's own are root's alone), removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="tidal-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def owned_dir(path: Path, unix_user: str) -> Path:
    pw = pwd.getpwnam(unix_user)
    path.mkdir()
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


def reference_run(tmp_path: Path) -> tuple[bytes, bytes]:
    """The job's output and its progress file from an uninterrupted run, outside Tidal."""
    ref = tmp_path / "reference"
    ref.mkdir()
    gate = tmp_path / "reference-gate"
    gate.touch()
    out = subprocess.run(["sh", "-c", JOB], cwd=ref, env={**os.environ, "GATE": str(gate)},
                         capture_output=True, check=True, timeout=120).stdout
    return out, (ref / "progress.txt").read_bytes()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    from tests.system.postgres import PostgresServer

    server = PostgresServer()  # no skip: the server binaries are part of the test environment
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: Any, request: pytest.FixtureRequest) -> str:
    import re

    name = "t_" + re.sub(r"\W", "_", request.node.name)[:50].lower()
    return postgres_server.create_database(name)  # type: ignore[no-any-return]
