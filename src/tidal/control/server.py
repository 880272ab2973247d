"""The control-plane process: migrate the database, recover from a restart, then serve the API and run
the reconcile loop. ``python -m tidal.control.server --port P`` (``tidal up`` starts it)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn
from sqlalchemy import select, update

from tidal.config import load_settings
from tidal.control import agents, clock
from tidal.control.api.app import Context, create_app
from tidal.control.history import record
from tidal.control.reconcile import Reconciler
from tidal.control.rendezvous import RendezvousHost
from tidal.control.store.db import Database
from tidal.control.store.models import ActionRow, NodeRow
from tidal.errors import ConfigError, TidalError, ValidationError
from tidal.mechanisms.interpose import storeserver
from tidal.policy.admission import Quotas, parse_quotas
from tidal.policy.registry import DEFAULT_LIVE_POLICY, LIVE_POLICIES, make_live_policy


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
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8470)
    ap.add_argument("--lease", type=float, default=5.0, help="seconds an agent's lease lasts")
    ap.add_argument("--policy", default=DEFAULT_LIVE_POLICY, choices=LIVE_POLICIES)
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


def serve(args: argparse.Namespace) -> None:
    """Migrate the database, recover, then serve the API and run the reconcile loop until stopped."""
    os.umask(0o077)  # logs and the SQLite file are the owner's only
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = load_settings()
    quotas = _quotas(settings.quotas)
    home = Path(settings.home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Distributed jobs' rendezvous store: the one a killed predecessor left running, if there is one.
    storeserver.hold(home)
    db = Database(settings.db_url)
    db.migrate()
    recover(db, args.lease)
    host = RendezvousHost()
    db.info["rendezvous"] = host
    host.prepare(db)  # adopt the store that the distributed jobs still running use
    rec = Reconciler(db, make_live_policy(args.policy))
    rec.start()
    app = create_app(Context(db=db, home=home, keep=settings.keep_checkpoints, lease_s=args.lease, quotas=quotas))
    try:
        # Long-polling agents must not hold a shutdown up: give open requests one second.
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=1)
    finally:
        rec.stop()
        db.close()
        storeserver.close_shared()


if __name__ == "__main__":
    main()
