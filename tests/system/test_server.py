"""A deployment as an operator runs it, on loopback with real processes: `tidal server --tls auto`, a node
joining with `tidal agent --join-token`, the CLI over TLS with the CA file or the pinned fingerprint.

Checked: the join token is exchanged once for the node's own credential (kept owner-only in the node root)
and refused after; a job runs on the node end to end over TLS, and another is checkpointed into the store the
server was given (`--store`, told to the agent at registration) and resumed; another node's credential is
refused for this node; a revoked credential stops the agent (its ranks with it), `tidal node remove` forgets
the node, and it joins again with a new join token; a client (the CLI, an agent) that does not trust the
server's certificate refuses to talk to it and says what to do; `tidal token create/ls/revoke` work for the
admin and are refused to a user."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tidal.mechanisms.criu.provision import find_criu
from tidal.testing import pid_alive, wait_until
from tidal.testing.hostcluster import FINGERPRINT, wait_serving
from tidal.waiting import WaitTimeout

pytestmark = pytest.mark.criu

EXIT_REFUSED = 78


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class Deployment:
    base: Path
    home: Path
    url: str
    fingerprint: str
    ca: Path
    server: subprocess.Popen[bytes]
    server_log: Path
    agents: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)

    @property
    def admin(self) -> str:
        return (self.home / "tokens" / "admin.token").read_text().strip()

    def env(self, token: str | None = None, **trust: str) -> dict[str, str]:
        """The CLI's environment: this server's URL, ``token`` (the admin's), and ``trust`` (TIDAL_CA=...,
        TIDAL_CA_FINGERPRINT=...; none given: the CA file)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
        return {**env, "COLUMNS": "250", "TIDAL_HOME": str(self.base / "client-home"), "TIDAL_URL": self.url,
                "TIDAL_TOKEN": token or self.admin, **(trust if trust else {"TIDAL_CA": str(self.ca)})}

    def cli(self, *args: str, token: str | None = None, cwd: Path | None = None,
            **trust: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=True, text=True,
                              env=self.env(token, **trust), cwd=cwd, timeout=120)

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=self.ca), timeout=30,
                            headers={"Authorization": f"Bearer {token or self.admin}"})

    def start_agent(self, name: str, *args: str, root: Path | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        """`tidal agent --server URL --name NAME ARGS...`, with its own TIDAL_HOME (a node's machine)."""
        log = self.base / f"agent-{name}-{len(self.agents)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
        env["TIDAL_HOME"] = str(self.base / f"node-home-{name}")
        root = root or self.base / "roots" / name
        with log.open("wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "agent", "--server", self.url,
                                  "--name", name, "--devices", "1", "--root", str(root), *args],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        self.agents[f"{name}-{len(self.agents)}"] = (p, log)
        return p, log

    def node(self, name: str) -> dict[str, object] | None:
        with self.api() as c:
            return next((n for n in c.get("/v1/nodes").json() if n["name"] == name), None)


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    find_criu()  # no skip: `make test` provisions CRIU
    base = tmp_path
    home = base / "server-home"
    port = _free_port()
    log = base / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env["TIDAL_HOME"] = str(home)
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "tidal.cli.main", "server", "--listen", f"127.0.0.1:{port}", "--tls", "auto",
             "--tls-san", "127.0.0.1", "--lease", "3", "--store", str(base / "store")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    d: Deployment | None = None
    try:
        ca = home / "tls" / "ca.pem"
        wait_serving(server, log, f"https://127.0.0.1:{port}", ca, timeout=60)
        m = wait_until(lambda: FINGERPRINT.search(_log(log)), timeout=10,
                       what="the CA's fingerprint in the server's output")
        d = Deployment(base, home, f"https://127.0.0.1:{port}", m.group(1), ca, server, log)
        yield d
    finally:
        for p, _ in (d.agents.values() if d else []):
            _stop(p)
        _stop(server)


def test_a_node_joins_runs_a_job_over_tls_and_is_revoked(deployment: Deployment, tmp_path: Path) -> None:
    d = deployment
    out = _log(d.server_log)
    # The banner: what to trust, and the command a node joins with.
    assert f"tidal agent --server {d.url} --ca-fingerprint {d.fingerprint} --join-token TOKEN --name NODE" in out
    assert f"export TIDAL_CA={d.ca}" in out and "tidal token create --node NODE" in out
    tls = d.home / "tls"
    assert all(stat.S_IMODE((tls / f).stat().st_mode) == 0o600 for f in ("ca.key", "server.key"))
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700

    # The admin's token commands; a user is refused them.
    with d.api() as c:
        r = c.post("/v1/users", json={"name": "ops", "role": "user", "unix_user": "root", "allow_root": True})
        assert r.status_code == 201, r.text
    user = r.json()["token"]
    p = d.cli("token", "create", "--node", "n1", token=user)
    assert p.returncode == 1 and "error: this needs an admin token" in p.stderr, p.stderr
    p = d.cli("token", "create", "--node", "n1")
    assert p.returncode == 0, p.stderr
    join_token = re.search(r"^(tdj_\S+)$", p.stdout, re.M).group(1)  # type: ignore[union-attr]
    created = re.search(r"join token (jt-[0-9a-f]+) for node n1", p.stdout).group(1)  # type: ignore[union-attr]
    assert f"tidal agent --server {d.url} --ca-fingerprint {d.fingerprint} --join-token {join_token} --name n1" \
        in p.stdout
    spare = d.cli("token", "create", "--node", "n9", "--ttl", "10m", "-q").stdout.strip()
    assert spare.startswith("tdj_")

    # The node joins: the join token is exchanged for n1's own credential, kept owner-only in its root.
    agent, agent_log = d.start_agent("n1", "--ca-fingerprint", d.fingerprint, "--advertise-addr", "127.0.0.1",
                                     "--join-token", join_token)
    try:
        wait_until(lambda: (d.node("n1") or {}).get("up"), timeout=60, what="n1 to join")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}\nthe agent's log:\n{_log(agent_log)}") from None
    assert (d.node("n1") or {})["address"] == "127.0.0.1"
    kept = d.base / "roots" / "n1" / "agent.token"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and kept.read_text().startswith("tdl_")
    first_credential = kept.read_text()
    assert f"checkpoint store: {d.base / 'store'}" in _log(agent_log)  # the server's --store, told at registration
    assert join_token not in " ".join(Path(f"/proc/{agent.pid}/cmdline").read_text().split("\0"))

    # The join token is used up: a second agent presenting it is refused and stops.
    again, again_log = d.start_agent("n1", "--ca", str(d.ca), "--join-token", join_token, root=d.base / "other")
    assert again.wait(60) == EXIT_REFUSED
    assert f"ERROR n1: the control plane refused POST /v1/agent/join: join token {created} for node n1 was already " \
           "used" in _log(again_log)

    # A job runs on it, end to end, through the CLI over TLS (pinned fingerprint).
    work = tmp_path / "work"
    work.mkdir()
    p = d.cli("submit", "-q", "--", "sh", "-c", "echo hello over tls", token=user, cwd=work,
              TIDAL_CA_FINGERPRINT=d.fingerprint)
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip()
    assert d.cli("wait", job, token=user).returncode == 0
    assert d.cli("logs", job, token=user).stdout == "hello over tls\n"
    nodes = d.cli("nodes").stdout
    assert re.search(r"^n1\s+127\.0\.0\.1\s+local/local\s", nodes, re.M), nodes

    # Another node's credential is refused for this node.
    with httpx.Client(base_url=d.url, verify=ssl.create_default_context(cafile=d.ca), timeout=30) as c:
        r = c.post("/v1/agent/join", json={"name": "n9"}, headers={"Authorization": f"Bearer {spare}"})
        assert r.status_code == 200, r.text
        n9 = r.json()["token"]
        r = c.post("/v1/agent/register", headers={"Authorization": f"Bearer {n9}"},
                   json={"agent_id": "intruder", "name": "n1", "devices": 1, "cpus": [[0]]})
    assert r.status_code == 403 and r.json()["message"] == "this credential is node n9's: it cannot act for node n1"

    # A checkpoint goes to the store the server was given (--store), and the job resumes from it.
    sleeper = d.cli("submit", "-q", "--", "sleep", "600", token=user, cwd=work).stdout.strip()

    def running() -> int | None:
        with d.api(user) as c:
            j = c.get(f"/v1/jobs/{sleeper}").json()
        return j["placement"][0]["pid"] if j["state"] == "running" and not j["busy"] and j["placement"] and \
            all(pl["pid"] for pl in j["placement"]) else None

    wait_until(running, timeout=60, what="the sleeper to run")
    assert d.cli("preempt", sleeper, token=user).returncode == 0
    assert list((d.base / "store").rglob("manifest.json"))
    assert d.cli("resume", sleeper, token=user).returncode == 0
    pid = wait_until(running, timeout=60, what="the sleeper to run again")

    # Revoking n1's credential: the agent's next call is refused; it stops its ranks and exits.
    p = d.cli("token", "revoke", "n1")
    assert p.returncode == 0 and "revoked node n1's credential" in p.stdout, p.stderr
    assert agent.wait(30) == EXIT_REFUSED
    assert "ERROR n1: the control plane refused POST /v1/agent/n1/heartbeat: invalid API token: unknown, or revoked: " \
           "node n1's credential is refused; stopping every rank and exiting" in _log(agent_log)
    wait_until(lambda: not pid_alive(pid), timeout=30, what="the revoked node's rank to be killed")
    p = d.cli("node", "remove", "n1")
    assert p.returncode == 0 and "removed node n1" in p.stdout, p.stdout + p.stderr
    assert d.node("n1") is None

    # Joining again: the agent's kept credential is refused, so it joins with the new join token it is given.
    rejoin = d.cli("token", "create", "--node", "n1", "-q").stdout.strip()
    agent, agent_log = d.start_agent("n1", "--ca", str(d.ca), "--join-token", rejoin)
    wait_until(lambda: (d.node("n1") or {}).get("up"), timeout=60, what="n1 to join again")
    assert "joining again with the join token given" in _log(agent_log)
    assert kept.read_text().startswith("tdl_") and kept.read_text() != first_credential  # a new one, kept there

    # Token listing and revoking a join token.
    extra = d.cli("token", "create", "--node", "n3").stdout
    extra_id = re.search(r"join token (jt-[0-9a-f]+)", extra).group(1)  # type: ignore[union-attr]
    assert d.cli("token", "revoke", extra_id).returncode == 0
    listing = d.cli("token", "ls", "-o", "json").stdout
    assert '"state": "used"' in listing and '"state": "revoked"' in listing and "tdj_" not in listing
    # A user's `tidal token ls` lists their own API tokens (never a secret); the join tokens are an admin's.
    mine = json.loads(d.cli("token", "ls", "-o", "json", token=user).stdout)
    assert [(t["user"], t["label"], t["state"]) for t in mine] == [("ops", "initial", "active")]
    assert "tdl_" not in json.dumps(mine)
    p = d.cli("token", "revoke", extra_id, token=user)
    assert p.returncode == 1 and "this needs an admin token" in p.stderr


def test_clients_that_do_not_trust_the_certificate_refuse_to_talk(deployment: Deployment) -> None:
    d = deployment
    # No CA, no pin: the system's trust store does not know the server's private CA.
    p = d.cli("token", "ls", TIDAL_CA="", TIDAL_CA_FINGERPRINT="")
    err = " ".join(p.stderr.split())  # as printed, wrapped at the terminal's width
    assert p.returncode == 1 and "Traceback" not in err
    assert f"error: refusing to talk to the control plane at {d.url}: its certificate is not trusted" in err
    assert "hint: give its CA certificate with TIDAL_CA=FILE" in err and "TIDAL_CA_FINGERPRINT" in err
    # A wrong pin.
    wrong = ":".join(["AB"] * 32)
    p = d.cli("token", "ls", TIDAL_CA_FINGERPRINT=wrong)
    err = " ".join(p.stderr.split())
    assert p.returncode == 1 and f"no certificate with the pinned SHA-256 fingerprint {wrong}" in err, p.stderr
    assert d.fingerprint in err  # what the server did present
    # With the CA file, or the right pin (in any usual form): it works.
    assert d.cli("token", "ls").returncode == 0
    assert d.cli("token", "ls", TIDAL_CA_FINGERPRINT=d.fingerprint.replace(":", "").lower()).returncode == 0
    # An agent with a wrong pin does not join, and says why.
    token = d.cli("token", "create", "--node", "n2", "-q").stdout.strip()
    agent, log = d.start_agent("n2", "--ca-fingerprint", wrong, "--join-token", token)
    assert agent.wait(60) == EXIT_REFUSED
    assert "refusing to talk to the control plane" in _log(log) and "--ca-fingerprint" in _log(log)
    with d.api() as c:
        states = {t["node"]: t["state"] for t in c.get("/v1/tokens").json() if t["kind"] == "join"}
    assert states["n2"] == "active"  # nothing was sent to the impostor, the join token is still good
