"""A Tidal deployment on test hosts, set up the way docs/deploy.md tells an operator to: PostgreSQL on a host
of its own, SeaweedFS (the S3 checkpoint store) on another, ``tidal server --tls auto`` on a third, and one
``tidal agent`` per node host, each joined with its own join token, pinning the server's certificate and
advertising its host's address. Working directories go under the net's shared directory (the stand-in for
NFS)::

    with TestNet(names=["cp", "db", "s3", "n1", "n2"]) as net:
        cluster = HostCluster(net, nodes=["n1", "n2"])
        job = cluster.submit(["python", "train.py"], cwd=net.shared / "work")
        cluster.wait_state(job, "succeeded")
        cluster.kill_server(); cluster.start_server()      # the control plane's host fails and comes back
        cluster.kill_agent("n1"); cluster.start_agent("n1")

Every process runs on its host through ``nsenter --net`` (:meth:`tidal.testing.hosts.Host.popen`); the test
process reaches them over the net's bridge, as the CLI on an operator's laptop would. Everything stops when
the net closes. Logs: :meth:`HostCluster.diagnostics` gives the tail of each, for assertion messages.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import ssl
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tidal.errors import TidalError
from tidal.testing.hosts import Host, TestNet
from tidal.testing.postgres import PostgresServer
from tidal.testing.relay import Relay
from tidal.testing.seaweedfs import SeaweedFS
from tidal.waiting import WaitTimeout, wait_until

#: The control plane's port on its host (each host has its own network: no other run can hold it).
SERVER_PORT = 8470
#: The rendezvous store's port on the control plane's host (``--rendezvous-port``, as docs/deploy.md sets it).
RENDEZVOUS_PORT = 8471
#: Where checkpoints go in the store's bucket.
STORE_PREFIX = "checkpoints"
#: How much of each log :meth:`HostCluster.diagnostics` shows.
LOG_TAIL = 4000

FINGERPRINT = re.compile(r"CA fingerprint \(SHA-256\): ([0-9A-F:]{95})")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Tidal's settings (each process of a deployment gets its own)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}, "PYTHONUNBUFFERED": "1", **extra}


def wait_serving(proc: subprocess.Popen[bytes], log: Path, url: str, ca: Path, timeout: float = 90) -> None:
    """Wait until ``tidal server`` (``proc``, writing ``log``) answers ``url``/healthz over TLS with the CA
    ``ca`` that ``--tls auto`` makes; its exit is an error that shows its log."""
    def serving() -> bool:
        if proc.poll() is not None:
            raise TidalError(f"tidal server exited {proc.returncode}:\n{tail(log)}")
        try:
            return ca.exists() and httpx.get(f"{url}/healthz", timeout=2,
                                             verify=ssl.create_default_context(cafile=ca)).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(serving, timeout=timeout, what="tidal server to serve over TLS")


def tail(path: Path, n: int = LOG_TAIL) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


@dataclass
class NodeAgent:
    """One node: its host, its agent process (None while stopped), its root and its log."""

    name: str
    host: Host
    devices: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> Path:
        return self.host.dir / "node-root"

    @property
    def log(self) -> Path:
        return self.host.dir / "agent.log"


class HostCluster:
    """Tidal on the hosts of ``net``: see the module's documentation.

    ``nodes``: the names of the node hosts (each gets an agent with ``devices`` devices); ``server``,
    ``database``, ``store``: the hosts of the control plane, PostgreSQL and SeaweedFS (one host may hold
    several). ``lease``: the agents' lease (seconds). Jobs run as ``unix_user`` (the user "ops" the cluster
    makes, whose token the CLI uses by default). ``agent_env``: more environment for every agent (e.g.
    ``TIDAL_STORE_CONCURRENCY``); ``seaweedfs``: keyword arguments of :class:`SeaweedFS` (its volumes).

    ``regions``: region → (the hosts of its store, then of its nodes): each region's nodes join it (and a
    cluster of the same name), and each region keeps its checkpoints in a SeaweedFS of its own
    (``tidal server --store REGION=URL``, the URL naming its server); ``nodes`` and ``store`` are then
    ignored. Every store takes the same credentials, as one site's would."""

    def __init__(self, net: TestNet, nodes: Sequence[str] = ("n1", "n2"), *, server: str = "cp",
                 database: str = "db", store: str = "s3", lease: float = 5.0, devices: int = 1,
                 unix_user: str = "root", policy: str | None = None, server_args: Sequence[str] = (),
                 agent_env: Mapping[str, str] | None = None, seaweedfs: Mapping[str, Any] | None = None,
                 regions: Mapping[str, tuple[str, Sequence[str]]] | None = None, region_delay: float = 0.0) -> None:
        self.net, self.lease, self.policy, self.server_args = net, lease, policy, list(server_args)
        self.agent_env = dict(agent_env or {})
        self.server_host = net[server]
        self.postgres = PostgresServer(host=net[database])
        self.database_url = self.postgres.create_database("tidal")
        self.region_of: dict[str, str] = {}
        self.region_s3: dict[str, SeaweedFS] = {}
        self.region_far: dict[str, str] = {}  # region → its store's endpoint as other regions reach it
        if regions:
            secret = secrets.token_hex(16)
            for region, (store_host, region_nodes) in regions.items():
                self.region_s3[region] = SeaweedFS(host=net[store_host], secret_key=secret, **(seaweedfs or {}))
                self.region_of.update(dict.fromkeys(region_nodes, region))
            nodes = list(self.region_of)
            self.s3 = next(iter(self.region_s3.values()))
            if region_delay > 0:
                # From another region a store is reached through a relay on its host that delays each way;
                # a region's own nodes reach it directly (their TIDAL_CHECKPOINT_STORE).
                for region, weed in self.region_s3.items():
                    relay = Relay((weed.addr, weed.ports["s3"]), region_delay, host=net[regions[region][0]])
                    net.on_close(relay.stop)
                    self.region_far[region] = f"http://{relay.addr}:{relay.port}"
        else:
            self.s3 = SeaweedFS(host=net[store], **(seaweedfs or {}))
        self.store_url = self.s3.url(STORE_PREFIX)
        #: ``tidal server --store`` values: one store, or each region's (its URL naming its own server, as
        #: other regions reach it).
        self.stores = [f"{r}={self.region_store_url(r, far=True)}" for r in self.region_s3] or [self.store_url]
        self.home = self.server_host.dir / "home"
        self.server_log = self.server_host.dir / "server.log"
        self.url = f"https://{self.server_host.addr}:{SERVER_PORT}"
        self.client_home = net.dir / "client-home"
        self.server_proc: subprocess.Popen[bytes] | None = None
        self.agents = {name: NodeAgent(name, net[name], devices) for name in nodes}
        net.on_close(self.close)
        self.start_server()
        self.ca = self.home / "tls" / "ca.pem"
        self.fingerprint = wait_until(lambda: FINGERPRINT.search(tail(self.server_log, 1 << 20)), timeout=10,
                                      what="the CA's fingerprint in the server's output").group(1)
        self.admin_token = (self.home / "tokens" / "admin.token").read_text().strip()
        with self.api(self.admin_token) as c:
            # Jobs run as root by default here (the test hosts' own account): said so explicitly.
            r = c.post("/v1/users", json={"name": "ops", "role": "user", "unix_user": unix_user, "allow_root": True})
            if r.status_code != 201:
                raise TidalError(f"making user ops: {r.status_code} {r.text}")
            # The benchmarks submit thousands of jobs as fast as they are answered: no rate or queue limit for it.
            limits = c.patch("/v1/users/ops/limits", json={"rate": "unlimited", "max_queued": "unlimited"})
            if limits.status_code != 200:
                raise TidalError(f"setting the limits of user ops: {limits.status_code} {limits.text}")
        self.user_token: str = r.json()["token"]
        for name in nodes:
            self.start_agent(name, join=True)
        for name in nodes:
            self.wait_node_up(name)

    def region_store_url(self, region: str, far: bool = False) -> str:
        """The URL of ``region``'s store; ``far``: as other regions reach it (through the delaying relay, where
        the regions are apart by ``region_delay``)."""
        weed = self.region_s3[region]
        endpoint = self.region_far.get(region, weed.endpoint_url) if far else weed.endpoint_url
        return f"{weed.url(STORE_PREFIX)}?endpoint={endpoint}&addressing=path"

    # the control plane

    def start_server(self) -> None:
        """Start ``tidal server`` on its host (again: on the same database, home and certificates), and wait
        until it serves over TLS."""
        host = self.server_host
        argv = [sys.executable, "-m", "tidal.cli.main", "server", "--listen", f"{host.addr}:{SERVER_PORT}",
                "--database", self.database_url, *(a for url in self.stores for a in ("--store", url)),
                "--tls", "auto",
                "--tls-san", host.addr, "--lease", f"{self.lease:g}", "--rendezvous-port", str(RENDEZVOUS_PORT),
                *(["--policy", self.policy] if self.policy else []), *self.server_args]
        with self.server_log.open("ab") as out:
            self.server_proc = host.popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                          env=clean_env(TIDAL_HOME=str(self.home), **self.s3.store_env()))
        wait_serving(self.server_proc, self.server_log, self.url, self.home / "tls" / "ca.pem")

    def kill_server(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """End the control plane (SIGKILL: its host failed; SIGTERM: stopped by its operator)."""
        if self.server_proc is not None:
            _end(self.server_proc, sig)
            self.server_proc = None

    # nodes

    def start_agent(self, name: str, *, join: bool = False) -> NodeAgent:
        """Start node ``name``'s agent on its host; ``join``: with a new join token (its first start), else
        with the credential it kept in its root."""
        node = self.agents[name]
        argv = [sys.executable, "-m", "tidal.cli.main", "agent", "--server", self.url, "--name", name,
                "--devices", str(node.devices), "--root", str(node.root), "--ca-fingerprint", self.fingerprint,
                "--advertise-addr", node.host.addr]
        if name in self.region_of:
            argv += ["--region", self.region_of[name], "--cluster", self.region_of[name]]
        env = clean_env(TIDAL_HOME=str(node.host.dir / "home"), **{**self.s3.store_env(), **self.agent_env})
        if name in self.region_of and self.region_far:  # its own region's store, directly
            env["TIDAL_CHECKPOINT_STORE"] = self.region_store_url(self.region_of[name])
        if join:
            with self.api(self.admin_token) as c:
                r = c.post("/v1/tokens", json={"node": name})
                if r.status_code != 201:
                    raise TidalError(f"a join token for {name}: {r.status_code} {r.text}")
            env["TIDAL_JOIN_TOKEN"] = r.json()["token"]
        with node.log.open("ab") as out:
            node.proc = node.host.popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        return node

    def kill_agent(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        node = self.agents[name]
        if node.proc is not None:
            _end(node.proc, sig)
            node.proc = None

    def node(self, name: str) -> dict[str, Any] | None:
        with self.api(self.admin_token) as c:
            return next((n for n in c.get("/v1/nodes").json() if n["name"] == name), None)

    def wait_node_up(self, name: str, timeout: float = 90) -> None:
        node = self.agents[name]

        def up() -> bool:
            if node.proc is not None and node.proc.poll() is not None:
                raise TidalError(f"the agent of {name} exited {node.proc.returncode}:\n{tail(node.log)}")
            return bool((self.node(name) or {}).get("up"))

        try:
            wait_until(up, timeout=timeout, what=f"node {name} to be up")
        except WaitTimeout as exc:
            raise TidalError(f"{exc}\n{self.diagnostics()}") from None

    # clients

    def env(self, token: str | None = None, **extra: str) -> dict[str, str]:
        """The CLI's environment: this cluster's URL and CA, ``token`` (default: user ops's)."""
        return clean_env(COLUMNS="250", TIDAL_HOME=str(self.client_home), TIDAL_URL=self.url,
                         TIDAL_TOKEN=token or self.user_token, TIDAL_CA=str(self.ca), **extra)

    def cli(self, *args: str, token: str | None = None, cwd: Path | None = None, check: bool = True,
            env: Mapping[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=True, text=True,
                           cwd=cwd, env={**self.env(token), **(env or {})}, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise TidalError(f"tidal {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def api(self, token: str | None = None, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout,
                            verify=ssl.create_default_context(cafile=self.home / "tls" / "ca.pem"),
                            headers={"Authorization": f"Bearer {token or self.user_token}"})

    def submit(self, argv: Sequence[str], *, cwd: Path, options: Sequence[str] = (),
               env: Mapping[str, str] | None = None) -> str:
        """``tidal submit -q OPTIONS -- ARGV`` in ``cwd``, as user ops; the job's id."""
        return self.cli("submit", "-q", *options, "--", *argv, cwd=cwd, env=env).stdout.strip()

    def job(self, job_id: str) -> dict[str, Any]:
        with self.api() as c:
            r = c.get(f"/v1/jobs/{job_id}")
        if r.status_code != 200:
            raise TidalError(f"GET /v1/jobs/{job_id}: {r.status_code} {r.text}")
        return dict(r.json())

    def wait_state(self, job_id: str, *states: str, timeout: float = 120) -> dict[str, Any]:
        """The job once it is in one of ``states`` (and not in the middle of an operation)."""
        def there() -> dict[str, Any] | None:
            with contextlib.suppress(httpx.TransportError):
                j = self.job(job_id)
                return j if j["state"] in states and not j.get("busy") else None
            return None

        try:
            return wait_until(there, timeout=timeout, what=f"job {job_id} to be {'/'.join(states)}")
        except WaitTimeout as exc:
            raise TidalError(f"{exc}: it is {self.job(job_id)}\n{self.diagnostics()}") from None

    def running_on(self, job_id: str, timeout: float = 120) -> dict[int, tuple[str, int]]:
        """Once every rank of the job runs: rank -> (node, pid)."""
        def placed() -> dict[int, tuple[str, int]] | None:
            with contextlib.suppress(httpx.TransportError):
                j = self.job(job_id)
                pl = j.get("placement") or []
                if j["state"] == "running" and not j.get("busy") and pl and all(p.get("pid") for p in pl):
                    return {int(p["rank"]): (str(p["node"]), int(p["pid"])) for p in pl}
            return None

        try:
            return wait_until(placed, timeout=timeout, what=f"every rank of job {job_id} to run")
        except WaitTimeout as exc:
            raise TidalError(f"{exc}: it is {self.job(job_id)}\n{self.diagnostics()}") from None

    # diagnostics and the end

    def diagnostics(self) -> str:
        """The tail of the server's and every agent's log."""
        parts = [f"--- tidal server ({self.server_host.name}) ---\n{tail(self.server_log)}"]
        parts += [f"--- agent {n.name} ---\n{tail(n.log)}" for n in self.agents.values()]
        return "\n".join(parts)

    def close(self) -> None:
        """Stop the agents (their ranks with them), then the control plane; the net stops the rest."""
        for name in self.agents:
            self.kill_agent(name, signal.SIGTERM)
        self.kill_server(signal.SIGTERM)


def _end(proc: subprocess.Popen[bytes], sig: signal.Signals, grace: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
