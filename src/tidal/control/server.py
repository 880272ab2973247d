"""The control-plane process: migrate the database, recover from a restart, then serve the API and run
the reconcile loop. ``python -m tidal.control.server --port P`` (``tidal up`` starts it so, on loopback);
``tidal server`` runs it for a deployment (``--listen``, ``--database``, ``--store``, TLS, ``--bootstrap``:
the admin token and the command a node joins with)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, cast

import uvicorn
from sqlalchemy import select, update

from tidal.config import Settings, load_settings
from tidal.control import agents, clock, pki, userlimits
from tidal.control.api.app import Context, create_app
from tidal.control.bootstrap import bootstrap
from tidal.control.clusterfile import token_path
from tidal.control.drains import DrainRule
from tidal.control.history import record
from tidal.control.pki import ServerTLS
from tidal.control.reconcile import Reconciler
from tidal.control.regionstores import RegionStores, parse_stores
from tidal.control.rendezvous import RendezvousHost
from tidal.control.retention import Collector, Rules, parse_store_quotas
from tidal.control.store.db import Database
from tidal.control.store.models import ActionRow, NodeRow
from tidal.core import Links
from tidal.errors import ConfigError, TidalError, ValidationError
from tidal.mechanisms.interpose import storeserver
from tidal.mechanisms.storage import open_store
from tidal.policy.admission import Quotas, parse_quotas
from tidal.policy.registry import DEFAULT_LIVE_POLICY, LIVE_POLICIES, make_live_policy
from tidal.policy.sla_admission import MODES as SLA_MODES
from tidal.policy.sla_admission import SlaMode

log = logging.getLogger(__name__)

DEFAULT_PORT = 8470

#: The shortest lease: an agent renews its lease every fifth of it and fences itself max(0.5 s, lease / 4)
#: before it runs out (tidal.agent.lease), which a shorter lease leaves too little room for.
MIN_LEASE_S = 2.0


#: How often, at most, a pass runs only to explain new waiting jobs (Reconciler's ``explain_every``).
EXPLAIN_EVERY_S = 1.0


def recover(db: Database, lease_s: float) -> None:
    """After a (re)start: agents kept running while we were away, so give every node a fresh lease rather
    than declare it dead for our own downtime; and hand out again actions whose delivery we cannot be
    sure of (agents recognise an action id they already have)."""
    with db.tx() as s:
        now = clock.now(s)
        for node in s.scalars(select(NodeRow).where(NodeRow.up.is_(True))):
            why = agents.over_limits(node)
            if why is not None:  # registered before registrations were checked: it would not be now
                agents.expire(s, node, why)
                continue
            node.lease_until = max(node.lease_until, now + lease_s)
        s.execute(update(ActionRow).where(ActionRow.status == "sent").values(status="pending"))
        record(s, "control_plane_started", cause=f"pid-{os.getpid()}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="tidal-control")
    ap.add_argument("--listen", metavar="ADDR:PORT", help="where to serve the API (default 127.0.0.1:8470)")
    ap.add_argument("--host", help="the address to listen on (or --listen)")
    ap.add_argument("--port", type=int, help="the port to listen on (or --listen)")
    ap.add_argument("--lease", type=float, default=5.0, help="seconds an agent's lease lasts")
    ap.add_argument("--policy", default=DEFAULT_LIVE_POLICY, choices=LIVE_POLICIES)
    ap.add_argument("--database", help="SQLAlchemy URL (default TIDAL_DATABASE_URL, else SQLite under TIDAL_HOME)")
    ap.add_argument("--store", action="append", default=[], metavar="[REGION=]URL",
                    help="the checkpoint store, told to agents at registration: URL for every region, or "
                         "REGION=URL (repeated) for a region's own, with URL for the others (default "
                         "TIDAL_CHECKPOINT_STORE; without either, each agent's own)")
    ap.add_argument("--tls", choices=("auto", "off"), help="auto: a private CA and a server certificate under "
                                                           "TIDAL_HOME/tls; off: plain HTTP")
    ap.add_argument("--tls-cert", help="the server's certificate chain (PEM), with --tls-key")
    ap.add_argument("--tls-key", help="the server certificate's key (PEM, owner-only)")
    ap.add_argument("--tls-san", action="append", default=[], metavar="NAME",
                    help="--tls auto: a host name or address clients use (repeat)")
    ap.add_argument("--advertise-addr", metavar="ADDR",
                    help="the address nodes reach this host at (the rendezvous store of distributed jobs, the URL "
                         "printed for nodes); default: the first --tls-san, else the listen address")
    ap.add_argument("--rendezvous-port", type=int, default=0, metavar="PORT",
                    help="the port of the rendezvous store of distributed jobs (default: a free one at its first "
                         "start, then kept in TIDAL_HOME/rendezvous.json)")
    ap.add_argument("--metrics-public", action="store_true",
                    help="serve GET /metrics without a token (else one of role metrics or admin)")
    ap.add_argument("--bootstrap", action="store_true",
                    help="create the admin token if there is none, and print how nodes join (`tidal server`)")
    args = ap.parse_args(argv)
    try:
        serve(args)
    except TidalError as exc:  # a wrong setting: say what and exit, without a traceback
        sys.exit(f"tidal-control: {exc}")


def _quotas(text: str | None) -> Quotas | None:
    try:
        return parse_quotas(text) if text else None
    except ValidationError as exc:
        raise ConfigError(f"TIDAL_QUOTAS: {exc.message}", field="TIDAL_QUOTAS",
                          hint="set TIDAL_QUOTAS to 'project=share,...' with shares between 0 and 1, or unset "
                               "it") from None


def _admit_sla(text: str) -> SlaMode:
    if text not in SLA_MODES:
        raise ConfigError(f"TIDAL_ADMIT_SLA={text}: not one of {', '.join(SLA_MODES)}", field="TIDAL_ADMIT_SLA",
                          hint="off (admit as asked), demote or refuse; docs/cluster.md, Admission")
    return cast(SlaMode, text)


def _store_quotas(text: str | None) -> dict[str, int]:
    try:
        return parse_store_quotas(text)
    except ValidationError as exc:
        raise ConfigError(f"TIDAL_STORE_QUOTA: {exc.message}", field="TIDAL_STORE_QUOTA",
                          hint="set TIDAL_STORE_QUOTA to 'user=SIZE,...' ('*=SIZE' for the others), e.g. "
                               "'alice=2TiB,*=500GiB', or unset it") from None


def _collector(db: Database, settings: Settings, stores: RegionStores, rules: Rules) -> Collector | None:
    """Checkpoint retention and garbage collection, over every store the agents are told to use (without one,
    TIDAL_HOME/checkpoints: the agents' own under `tidal up`)."""
    urls = dict.fromkeys([*stores.regions.values(), stores.default or settings.store_url])
    opened = []
    try:
        for url in urls:
            opened.append(open_store(settings.model_copy(update={"checkpoint_store": url})))
    except TidalError as exc:
        log.warning("checkpoint retention is off: the control plane cannot open a checkpoint store: %s", exc)
        for store in opened:
            store.close()
        return None
    collector = Collector(db, opened, rules, interval=settings.collect_every)
    collector.start()
    return collector


def check_lease(lease_s: float) -> None:
    """``--lease``: at least :data:`MIN_LEASE_S` (NaN is refused too)."""
    if not lease_s >= MIN_LEASE_S:
        raise ConfigError(f"--lease {lease_s:g}: an agent's lease lasts at least {MIN_LEASE_S:g}s", field="lease",
                          hint="agents fence themselves up to a quarter of the lease before it runs out; give "
                               "one that outlasts a restart of the control plane, e.g. 30")


def listen_address(args: argparse.Namespace) -> tuple[str, int]:
    """Where to listen: ``--listen ADDR:PORT`` (an IPv6 address in brackets), else ``--host``/``--port``."""
    host, port = args.host or "127.0.0.1", args.port or DEFAULT_PORT
    if args.listen:
        addr, sep, p = args.listen.rpartition(":")
        if not sep or not p.isdigit() or not 0 < int(p) < 65536:
            raise ConfigError(f"--listen {args.listen!r}: give ADDR:PORT", field="listen",
                              hint="e.g. 0.0.0.0:8470, [::]:8470 or 10.0.0.5:8470")
        host, port = addr.strip("[]") or "0.0.0.0", int(p)
    return host, port


def tls_of(args: argparse.Namespace, home: Path, host: str) -> ServerTLS | None:
    """The certificate to serve, or None for plain HTTP (allowed on loopback, or with ``--tls off``)."""
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key) or args.tls == "auto":
            raise ConfigError("give both --tls-cert and --tls-key, without --tls auto", field="tls",
                              hint="or --tls auto alone, for a CA and certificate that Tidal makes")
        return pki.own(args.tls_cert, args.tls_key)
    if args.tls == "auto":
        return pki.ensure_auto(home, pki.names_for(host, args.tls_san))
    if args.tls is None and not _loopback(host):
        raise ConfigError(f"listening on {host} without TLS: tokens would cross the network in clear", field="tls",
                          hint="give --tls auto (or --tls-cert/--tls-key); --tls off where a proxy in front "
                               "terminates TLS")
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_host(host: str, sans: list[str], advertise: str | None = None) -> str:
    """The name or address nodes reach the control plane at: ``--advertise-addr``, else the first
    --tls-san, else the listen address unless it is a wildcard, else this machine's name."""
    return advertise or next(iter(sans), None) or (host if host not in pki.WILDCARDS else socket.getfqdn())


def public_url(host: str, port: int, tls: ServerTLS | None, sans: list[str], advertise: str | None = None) -> str:
    """The URL nodes reach the server at, for the join command."""
    name = public_host(host, sans, advertise)
    if ":" in name:
        name = f"[{name}]"
    return f"{'https' if tls else 'http'}://{name}:{port}"


def banner(url: str, home: Path, tls: ServerTLS | None, db_url: str, stores: RegionStores, lease_s: float) -> str:
    """What `tidal server` prints at start: where it serves, what it trusts, and how a node joins."""
    trust = ""
    lines = [f"Tidal control plane at {url}",
             f"  database: {_hide_password(db_url)}",
             f"  checkpoint store: {stores.describe()}",
             f"  agent lease: {lease_s:g}s",
             f"  admin token: {token_path(home, 'admin')}"]
    if tls is not None:
        lines.append(f"  TLS certificate: {tls.certfile} (names: {', '.join(tls.names)})")
        if tls.ca is not None:
            lines.append(f"  CA certificate: {tls.ca}")
        lines.append(f"  {'CA' if tls.ca is not None else 'certificate'} fingerprint (SHA-256): {tls.fingerprint}")
        trust = f" --ca-fingerprint {tls.fingerprint}"
    else:
        lines.append("  TLS: off (plain HTTP)")
    client = [f"export TIDAL_URL={url} TIDAL_TOKEN=$(cat {token_path(home, 'admin')})"]
    if tls is not None:
        client.append(f"export TIDAL_CA_FINGERPRINT={tls.fingerprint}" if tls.ca is None
                      else f"export TIDAL_CA={tls.ca}")
    lines += ["", "To add a node, create its join token here (as the admin):", *(f"  {c}" for c in client),
              "  tidal token create --node NODE", "then run on the node (as root):",
              f"  tidal agent --server {url}{trust} --join-token TOKEN --name NODE --devices N", ""]
    return "\n".join(lines)


def _hide_password(url: str) -> str:
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, cred = head.partition("://")
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in cred else ''}@{tail}"


def serve(args: argparse.Namespace) -> None:
    """Migrate the database, recover, then serve the API and run the reconcile loop until stopped."""
    os.umask(0o077)  # logs and the SQLite file are the owner's only
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    check_lease(args.lease)
    settings = load_settings()
    if args.database:
        settings = settings.model_copy(update={"database_url": args.database})
    try:
        stores = parse_stores(args.store or ([settings.checkpoint_store] if settings.checkpoint_store else []))
    except ValidationError as exc:
        raise ConfigError(exc.message, field="store", hint=exc.hint) from None
    quotas = _quotas(settings.quotas)
    admit_sla = _admit_sla(settings.admit_sla)
    home = Path(settings.home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    listen_host, port = listen_address(args)
    tls = tls_of(args, home, listen_host)
    if args.bootstrap:
        bootstrap(settings, ("admin",))
    # Distributed jobs' rendezvous store: the one a killed predecessor left running, if there is one.
    storeserver.hold(home, args.rendezvous_port)
    db = Database(settings.db_url)
    db.migrate()
    recover(db, args.lease)
    # Ranks on other hosts are given the rendezvous store at the address the nodes reach this host by.
    host = RendezvousHost(public_host(listen_host, args.tls_san, args.advertise_addr))
    db.info["rendezvous"] = host
    db.info["stores"] = stores  # which region's store holds a checkpoint, and where a restore copies it from
    db.info["drains"] = DrainRule(losses=settings.drain_lease_losses, window_s=settings.drain_window,
                                  healthy_s=settings.drain_healthy_for)
    db.info["limits"] = userlimits.Defaults.from_settings(settings)  # users' and projects' limits but overrides
    host.prepare(db)  # adopt the store that the distributed jobs still running use
    links = Links(region_gbps=settings.region_gbps) if settings.region_gbps else None
    rec = Reconciler(db, make_live_policy(args.policy), explain_every=EXPLAIN_EVERY_S, links=links,
                     device_caps=userlimits.device_caps, project_caps=userlimits.project_device_caps)
    rec.start()
    rules = Rules(keep=settings.keep_checkpoints, finished_after=settings.finished_retention,
                  quotas=_store_quotas(settings.store_quota))
    collector = _collector(db, settings, stores, rules)
    app = create_app(Context(db=db, home=home, keep=settings.keep_checkpoints, lease_s=args.lease, quotas=quotas,
                             admit_sla=admit_sla,
                             stores=stores, fingerprint=tls.fingerprint if tls else None, retention=rules,
                             metrics_public=args.metrics_public))
    if args.bootstrap:
        url = public_url(listen_host, port, tls, args.tls_san, args.advertise_addr)
        print(banner(url, home, tls, settings.db_url, stores, args.lease), flush=True)
    ssl: dict[str, Any] = {"ssl_certfile": str(tls.certfile), "ssl_keyfile": str(tls.keyfile)} if tls else {}
    try:
        # Long-polling agents must not hold a shutdown up: give open requests one second.
        uvicorn.run(app, host=listen_host, port=port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=1, **ssl)
    finally:
        if collector:
            collector.stop()
            collector.close()
        rec.stop()
        db.close()
        storeserver.close_shared()


if __name__ == "__main__":
    main()
