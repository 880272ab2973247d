"""Commands of a deployment over several machines: ``tidal server`` (the control plane), ``tidal agent`` (a
node joining it), ``tidal token create|ls|rotate|revoke`` (join tokens and node credentials, admin; users' own
tokens: :mod:`tidal.cli.users`) and ``tidal node remove|drain|undrain``.

``server`` and ``agent`` replace this process with the control plane's or the agent's own entry point
(``python -m tidal.control.server``, ``python -m tidal.agent``): the CLI runs nothing of them itself, and a
service manager sees one process. Secrets given to them (the database URL, a join token) travel in their
environment, not on their command line, which every account on the machine may read."""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from tidal.cli import listings, units, users
from tidal.cli.api import Api
from tidal.cli.formats import Format, output_option, print_rows
from tidal.cli.output import console
from tidal.cli.units import parse_duration
from tidal.errors import ConfigError, Conflict

JOIN_ID = re.compile(r"jt-[0-9a-f]{12}")  # a join token's id (tidal.control.tokens); anything else names a node
token_app = typer.Typer(help="Users' API tokens (create, list, rotate, revoke); join tokens for new nodes, and the "
                             "nodes' credentials (admin).", no_args_is_help=True)
node_app = typer.Typer(help="Nodes (admin): drain, undrain or remove one.", no_args_is_help=True)


def _exec(module: str, args: list[str], env: dict[str, str]) -> None:
    argv = [sys.executable, "-m", module, *args]
    sys.stdout.flush()
    os.execve(sys.executable, argv, {**os.environ, "PYTHONUNBUFFERED": "1", **env})


def register(app: typer.Typer) -> None:
    @app.command()
    def server(
        listen: str = typer.Option("0.0.0.0:8470", "--listen", help="ADDR:PORT to serve the API on"),
        database: str = typer.Option(None, "--database", envvar="TIDAL_DATABASE_URL", show_envvar=True,
                                     help="SQLAlchemy URL, e.g. postgresql+psycopg://tidal@db/tidal (default: "
                                          "SQLite under TIDAL_HOME)"),
        store: list[str] = typer.Option([], "--store", envvar="TIDAL_CHECKPOINT_STORE", show_envvar=True,
                                        metavar="[REGION=]URL",
                                        help="the checkpoint store nodes use (s3://bucket/prefix, or a directory "
                                             "at the same path on every node), told to agents when they register: "
                                             "URL for every region, or REGION=URL (repeat) for a region's own, "
                                             "with a plain URL for the others (docs/deploy.md, Regions)"),
        tls: str = typer.Option(None, "--tls", help="auto (default): a private CA and a server certificate under "
                                                     "TIDAL_HOME/tls; off: plain HTTP (behind a TLS proxy)"),
        tls_cert: Path = typer.Option(None, "--tls-cert", help="your own certificate chain (PEM)"),
        tls_key: Path = typer.Option(None, "--tls-key", help="its key (PEM, owner-only)"),
        tls_san: list[str] = typer.Option([], "--tls-san",
                                          help="--tls auto: a host name or address nodes and users reach the server "
                                               "by (repeat); the first is the URL printed for nodes"),
        advertise_addr: str = typer.Option(None, "--advertise-addr",
                                           help="the address nodes reach this host at: the rendezvous store of "
                                                "distributed jobs, the URL printed for nodes (default: the first "
                                                "--tls-san, else the listen address)"),
        rendezvous_port: int = typer.Option(0, "--rendezvous-port", min=0, max=65535,
                                            help="the port nodes reach the rendezvous store of distributed jobs "
                                                 "on, for firewall rules (default: a free one at the first start, "
                                                 "then kept)"),
        # Agents fence their ranks after three quarters of the lease without the control plane: 22.5 s, time
        # for a restart (an upgrade's migration included) that must not cost every job its latest work.
        lease: float = typer.Option(30.0, help="seconds an agent's lease lasts (fencing): agents kill their ranks if "
                                               "the control plane is unreachable for three quarters of it"),
        policy: str = typer.Option("singularity", help="scheduling policy: singularity | firstfit"),
        metrics_public: bool = typer.Option(False, "--metrics-public",
                                            help="serve GET /metrics without a token (else a token of role metrics "
                                                 "or admin; docs/metrics.md)"),
    ) -> None:
        """Run the control plane of a deployment (in the foreground; e.g. under systemd, deploy/)."""
        if tls not in (None, "auto", "off"):
            raise ConfigError(f"--tls {tls}: auto or off", field="tls")
        if tls is None and tls_cert is None and tls_key is None:
            tls = "auto"
        args = ["--bootstrap", "--listen", listen, "--lease", str(lease), "--policy", policy]
        if tls:
            args += ["--tls", tls]
        if tls_cert is not None:
            args += ["--tls-cert", str(tls_cert.absolute())]
        if tls_key is not None:
            args += ["--tls-key", str(tls_key.absolute())]
        for name in tls_san:
            args += ["--tls-san", name]
        for one in store:
            args += ["--store", one]
        if advertise_addr:
            args += ["--advertise-addr", advertise_addr]
        if rendezvous_port:
            args += ["--rendezvous-port", str(rendezvous_port)]
        if metrics_public:
            args.append("--metrics-public")
        _exec("tidal.control.server", args, {"TIDAL_DATABASE_URL": database} if database else {})

    @app.command()
    def agent(
        server: str = typer.Option(..., "--server", envvar="TIDAL_URL", show_envvar=True,
                                   help="the control plane's URL, e.g. https://tidal.example:8470"),
        join_token: str = typer.Option(None, "--join-token", envvar="TIDAL_JOIN_TOKEN", show_envvar=True,
                                       help="exchanged at the first start for the node's own credential (then kept "
                                            "in the node root); from `tidal token create --node NAME`"),
        name: str = typer.Option(None, "--name", help="the node's name (default: the host name)"),
        devices: str = typer.Option("1", "--devices", metavar="N|auto",
                                    help="devices the node offers: N CPU devices (shares of its CPUs), or auto: one "
                                         "per NVIDIA GPU (found through NVML: pip install 'tidal[gpu]')"),
        cluster: str = typer.Option("local", "--cluster", help="the cluster the node belongs to"),
        region: str = typer.Option("local", "--region", help="the region the node is in"),
        advertise_addr: str = typer.Option(None, "--advertise-addr", envvar="TIDAL_ADVERTISE_ADDR",
                                           help="the address the other nodes reach this one at"),
        root: Path = typer.Option(None, "--root", help="the node root: the node's private state, its credential "
                                                       "(default TIDAL_HOME/nodes/NAME)"),
        ca: Path = typer.Option(None, "--ca", envvar="TIDAL_CA", show_envvar=True,
                                help="trust the control plane's certificate through this CA (PEM)"),
        ca_fingerprint: str = typer.Option(None, "--ca-fingerprint", envvar="TIDAL_CA_FINGERPRINT", show_envvar=True,
                                           help="or pin it: the SHA-256 fingerprint `tidal server` printed"),
        token_file: Path = typer.Option(None, "--token-file", help="a credential to use instead (a file)"),
    ) -> None:
        """Run this node's agent (in the foreground, as root), joining the control plane at --server."""
        from tidal.config import load_settings  # here: the settings' import is most of a short command's start-up
        from tidal.core.topology import devices_option

        name = name or socket.gethostname().split(".")[0]
        node_root = root or load_settings().home / "nodes" / name
        args = ["--name", name, "--server", server, "--devices", str(devices_option(devices)), "--cluster", cluster,
                "--region", region, "--root", str(node_root.absolute())]
        for flag, value in (("--advertise-addr", advertise_addr), ("--ca", ca and str(ca.absolute())),
                            ("--ca-fingerprint", ca_fingerprint),
                            ("--token-file", token_file and str(token_file.absolute()))):
            if value:
                args += [flag, value]
        _exec("tidal.agent", args, {"TIDAL_JOIN_TOKEN": join_token} if join_token else {})

    app.add_typer(token_app, name="token")
    app.add_typer(node_app, name="node")


@token_app.command("create")
def token_create(node: str = typer.Option(None, "--node", help="a join token: the node it lets join (admin)"),
                 user: str = typer.Option(None, "--user", help="an API token of this user (yours, or as an admin "
                                                               "anyone's)"),
                 ttl: str = typer.Option(None, "--ttl", help="how long it is valid: 30m, 24h, 90d ... (default: 24h "
                                                            "for a join token; a user's token until revoked)"),
                 label: str = typer.Option(None, "--label", help="a user's token: a label to tell it by"),
                 quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the token")) -> None:
    """Create a join token for one node (--node), or an API token of a user (--user); shown once."""
    if (node is None) == (user is None):
        raise ConfigError("give --node NODE (a join token) or --user NAME (a user's API token)", field="token")
    if user is not None:
        users.token_create(user, ttl, label, quiet)
        return
    if label is not None:
        raise ConfigError("--label is for a user's token (--user)", field="label")
    api = Api(who="admin")
    r = api.post("/v1/tokens", json={"node": node, "ttl": parse_duration(ttl or "24h", "ttl")})
    if quiet:
        print(r["token"])
        return
    trust = f" --ca-fingerprint {r['fingerprint']}" if r.get("fingerprint") else ""
    console.print(f"join token {r['id']} for node {escape(r['node'])}, valid until {units.clock(r['expires_at'])} "
                  "(shown once, used up by the node's first join):", highlight=False)
    print(r["token"])
    console.print("on the node, as root:", highlight=False)
    print(f"  tidal agent --server {api.url}{trust} --join-token {r['token']} --name {r['node']} --devices N")
    console.print("(--devices N: N CPU devices; --devices auto: one device per NVIDIA GPU)", highlight=False)


@token_app.command("ls")
def token_ls(user: str = typer.Option(None, "--user", help="a user's API tokens (yours, or as an admin anyone's)"),
             output: Format = output_option()) -> None:
    """List join tokens (active, used, expired, revoked) and the agent credentials (admin); with --user, or
    for a user, a user's API tokens."""
    if not users.token_ls(user, output):
        print_rows(Api(who="admin").get("/v1/tokens"), listings.TOKENS, output)


@token_app.command("rotate")
def token_rotate(token_id: str = typer.Argument(..., metavar="ID", help="a user's token's id (tk-...)"),
                 quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the new token")) -> None:
    """Give a user's token a new secret (a new id, the same label and time to live): the old one is revoked at
    once."""
    users.token_rotate(token_id, quiet)


@token_app.command("revoke")
def token_revoke(target: str = typer.Argument(None, metavar="[ID|NODE]",
                                              help="a user's token's id (tk-...), a join token's id (jt-...), or a "
                                                   "node's name"),
                 node: str = typer.Option(None, "--node", help="a node's name (as NODE)")) -> None:
    """Revoke a user's token or a join token (ID), or a node's own credential and its unused join tokens (NODE: its
    agent stops at its next call)."""
    if (target is None) == (node is None):
        raise ConfigError("give a token's ID, or a node (NODE or --node NODE)", field="token",
                          hint="`tidal token ls` lists them")
    if target is not None and users.TOKEN_ID.fullmatch(target):
        users.token_revoke(target)
        return
    api = Api(who="admin")
    if target is not None and JOIN_ID.fullmatch(target):
        r = api.delete(f"/v1/tokens/{target}")
        if r["state"] == "revoked":
            console.print(f"revoked join token {r['id']} for node {escape(r['node'])}", highlight=False)
        else:
            raise Conflict(f"join token {r['id']} is {r['state']}: nothing to revoke",
                           hint=f"to revoke the credential node {r['node']} got with it: "
                                f"`tidal token revoke --node {r['node']}`")
        return
    r = api.delete(f"/v1/nodes/{node or target}/credential")
    _print_revoked(r)


def _print_revoked(r: dict[str, Any]) -> None:
    what = []
    if r["credential"]:
        what.append(f"node {r['node']}'s credential (its agent stops at its next call)")
    if r["join_tokens"]:
        what.append("join token(s) " + ", ".join(r["join_tokens"]))
    if what:
        console.print("revoked " + " and ".join(what), highlight=False)


@node_app.command("remove")
def node_remove(node: str = typer.Argument(..., help="the node"),
                no_wait: bool = typer.Option(False, "--no-wait", help="do not wait for the node to go down"),
                timeout: float = typer.Option(120.0, help="seconds to wait for the node to go down")) -> None:
    """Remove a node: revoke its credential (its agent stops its ranks and exits at its next call), then
    forget it once its lease has run out (its jobs are requeued)."""
    api = Api(who="admin")
    r = api.delete(f"/v1/nodes/{node}")
    _print_revoked(r)
    deadline = time.monotonic() + timeout
    while not r["removed"] and not no_wait and time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.1, float(r.get("lease_left_s") or 0.5))))
        r = api.delete(f"/v1/nodes/{node}")
    if r["removed"]:
        console.print(f"removed node {escape(node)}", highlight=False)
    elif no_wait:
        console.print(f"node {escape(node)} is up until its lease runs out ({r.get('lease_left_s')}s); "
                      "run `tidal node remove` again then to forget it", highlight=False)
    else:
        raise Conflict(f"node {node} is still up after {timeout:g}s",
                       hint="its agent may act with the cluster credential (`tidal up`), which is not revoked: stop "
                            "it (`systemctl stop tidal-agent`, or `tidal down`)")



@node_app.command("drain")
def node_drain(node: str = typer.Argument(..., help="the node"),
               reason: str = typer.Option(None, "--reason", metavar="TEXT",
                                          help="why, as `tidal nodes` shows it (at most 200 characters)")) -> None:
    """Drain a node: nothing new is placed or restored there, while its jobs run on, until `tidal node undrain`
    (as `kubectl cordon`). A node whose lease is lost too often is drained by itself, and undrained once healthy."""
    r = Api(who="admin").post(f"/v1/nodes/{node}/drain", json={"reason": reason})
    console.print(f"node {escape(node)} drained: {escape(r['drain_reason'])}", highlight=False)


@node_app.command("undrain")
def node_undrain(node: str = typer.Argument(..., help="the node")) -> None:
    """Undrain a node, whoever drained it: it takes new jobs again."""
    r = Api(who="admin").post(f"/v1/nodes/{node}/undrain")
    console.print(f"node {escape(node)} undrained" if r["drained"] is None else f"node {escape(node)} is drained: "
                  f"{escape(r['drain_reason'])}", highlight=False)
