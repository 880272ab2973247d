"""A local cluster on this machine: the control plane and N agents as background processes, with their
state (database, tokens, node roots, logs, checkpoints) under ``TIDAL_HOME``. Used by ``tidal up``,
``tidal status`` and ``tidal down``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from tidal.config import Settings
from tidal.control.bootstrap import TOKENS, bootstrap, private_dir
from tidal.control.clusterfile import ClusterState, Proc, alive, load, state_path, token_path
from tidal.core import limits
from tidal.errors import ConfigError, TidalError
from tidal.mechanisms.criu.rank import NodeRoot
from tidal.mechanisms.interpose import storeserver
from tidal.waiting import WaitTimeout, wait_until

__all__ = ["TOKENS", "agent_argv", "bootstrap", "down", "private_dir", "up"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(settings: Settings) -> dict[str, str]:
    """The cluster's processes share these settings whatever the caller's environment says."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TIDAL_HOME": str(settings.home)}
    for key, value in (("TIDAL_DATABASE_URL", settings.database_url),
                       ("TIDAL_CHECKPOINT_STORE", settings.checkpoint_store),
                       ("TIDAL_KEEP_CHECKPOINTS", str(settings.keep_checkpoints)),
                       ("TIDAL_QUOTAS", settings.quotas)):
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    for name in Settings.model_fields:  # the S3 store's endpoint, credentials and tuning
        if name.startswith("store_"):
            field = getattr(settings, name)
            if field is None:
                env.pop(f"TIDAL_{name.upper()}", None)
            else:
                env[f"TIDAL_{name.upper()}"] = field.get_secret_value() if isinstance(field, SecretStr) else str(field)
    return env


def _respawn(proc: Proc, settings: Settings) -> Proc:
    log = Path(proc.log)
    private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)  # one an older version wrote with the caller's umask, too
    with os.fdopen(fd, "ab") as out:
        p = subprocess.Popen(proc.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True, env=_env(settings))
    return Proc(p.pid, proc.argv, str(log))


def _wait(what: str, check: Any, timeout: float, log: str) -> None:
    try:
        wait_until(check, timeout=timeout, what=f"{what} to come up", interval=0.1)
    except WaitTimeout:
        tail = Path(log).read_text(errors="replace")[-2000:] if Path(log).exists() else ""
        raise TidalError(f"{what} did not come up within {timeout:.0f}s", hint=f"see {log}:\n{tail}") from None


def _healthy(url: str) -> bool:
    return httpx.get(f"{url}/healthz", timeout=2).status_code == 200


def _nodes_up(url: str, token: str, names: list[str]) -> bool:
    r = httpx.get(f"{url}/v1/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    up = {n["name"] for n in r.json() if n["up"]}
    return set(names) <= up


def agent_argv(home: Path, url: str, name: str, devices: int, region: str | None = None) -> list[str]:
    return [sys.executable, "-m", "tidal.agent", "--name", name, "--server", url,
            "--token-file", str(token_path(home, "cluster")), "--root", str(home / "nodes" / name),
            "--devices", str(devices), *(["--region", region, "--cluster", region] if region else [])]


def up(settings: Settings, nodes: int = 2, devices_per_node: int = 1, lease_s: float = 5.0,
       port: int | None = None, policy: str = "singularity", regions: Sequence[str] = (),
       stores: Sequence[str] = (), metrics_public: bool = False) -> tuple[ClusterState, list[str]]:
    """Start the cluster, or whatever of it is not running. Returns the state and what was started.
    ``regions``: node i's region, and its cluster of the same name (default: all in one); ``stores``: the
    control plane's ``--store`` values (``REGION=URL`` for a region's own); ``metrics_public``: the control
    plane serves GET /metrics without a token (a new cluster's only: a running one keeps how it was
    started)."""
    if nodes < 1 or devices_per_node < 1:
        raise ConfigError("a cluster needs at least one node with at least one device")
    if regions and len(regions) != nodes:
        raise ConfigError(f"{len(regions)} regions for {nodes} nodes: give one per node")
    if devices_per_node > limits.MAX_DEVICES_PER_NODE:
        raise ConfigError(f"{devices_per_node} devices per node: a node has at most {limits.MAX_DEVICES_PER_NODE}")
    home = Path(settings.home)
    bootstrap(settings)
    st = load(home)
    started: list[str] = []
    if st is None:
        port = port or _free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "tidal.control.server", "--port", str(port), "--lease", str(lease_s),
                "--policy", policy, *(a for store in stores for a in ("--store", store)),
                *(["--metrics-public"] if metrics_public else [])]
        st = ClusterState(url, port, Proc(0, argv, str(home / "logs" / "control.log")))
        for i in range(1, nodes + 1):
            name = f"node-{i}"
            st.agents[name] = Proc(0, agent_argv(home, url, name, devices_per_node,
                                                 regions[i - 1] if regions else None),
                                   str(home / "logs" / f"{name}.log"))
    if not alive(st.server.pid) if st.server.pid else True:
        st.server = _respawn(st.server, settings)
        started.append("control plane")
    state_path(home).write_text(json.dumps(st.to_json(), indent=1))
    _wait("the control plane", lambda: _healthy(st.url), 30, st.server.log)
    for name, proc in st.agents.items():
        if not proc.pid or not alive(proc.pid):
            st.agents[name] = _respawn(proc, settings)
            started.append(name)
    state_path(home).write_text(json.dumps(st.to_json(), indent=1))
    token = token_path(home, "admin").read_text().strip()
    _wait("the agents", lambda: _nodes_up(st.url, token, list(st.agents)), 30, st.server.log)
    return st, started


def _stop(pid: int, timeout: float = 10.0) -> None:
    if not pid or not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def down(settings: Settings) -> list[str]:
    """Stop the agents (their ranks die with them) and the control plane. The database stays."""
    home = Path(settings.home)
    st = load(home)
    if st is None:
        return []
    stopped = []
    for name, proc in st.agents.items():
        if proc.pid and alive(proc.pid):
            stopped.append(name)
        _stop(proc.pid)
        # Images a job kept in /dev/shm for its next checkpoint, also where an agent died without
        # cleaning up: nothing runs there any more.
        NodeRoot.of_agent(name, home / "nodes" / name).clear_staging()
    if st.server.pid and alive(st.server.pid):
        stopped.append("control plane")
    _stop(st.server.pid)
    storeserver.stop_recorded(home)  # outlives a control plane that was killed rather than stopped
    state_path(home).unlink(missing_ok=True)
    return stopped
