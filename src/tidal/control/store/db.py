"""The database: engine, schema migration (Alembic) and serialised transactions.

The control plane is one process; every change runs in :meth:`Database.tx` under one lock, so SQLite
never sees two writers and the reconcile loop and the API never interleave half-made decisions. The
lock's condition wakes long-polling agents and the reconcile loop after each commit.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, exc, make_url
from sqlalchemy.orm import Session, sessionmaker

from tidal.core.clock import SYSTEM, Clock

MIGRATIONS = Path(__file__).with_name("migrations")
# SQLite's companions of a database file: they hold the same rows.
SQLITE_FILES = ("", "-wal", "-shm", "-journal")
#: A server connection idle longer than this (seconds) is tested before it is used again.
PING_IDLE_S = 1.0


def private_sqlite(url: str) -> None:
    """Make a SQLite database file the owner's only, whatever the umask: it holds users' jobs and the
    hashes of their tokens. SQLite creates its WAL and shared-memory files with the database file's
    mode, so they follow. A file made readable to others by an older version is tightened."""
    db = make_url(url).database
    if not db or db == ":memory:" or db.startswith("file:"):
        return
    path = Path(db)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for suffix in SQLITE_FILES:
        f = path.with_name(path.name + suffix)
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            f.chmod(stat.S_IMODE(st.st_mode) & 0o700)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        private_sqlite(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:
            # WAL: readers never block the writer; NORMAL sync is durable across a process kill.
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    engine = create_engine(url)

    # A connection that sat in the pool may have been closed by the server (restarted, failed over, an
    # idle timeout): test it first, and take a new one if it is gone. Not one that was used within the
    # last PING_IDLE_S: under load (a burst of submissions) the test would be one more round trip per
    # transaction, 1 of 5 for a submission. A server lost within that second fails one transaction,
    # which invalidates the pool.
    @event.listens_for(engine, "checkin")
    def _returned(_conn: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(conn: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get("returned_at")
        if returned is None or time.monotonic() - returned < PING_IDLE_S:
            return  # new, or used just now
        try:
            engine.dialect.do_ping(conn)
        except Exception as e:
            raise exc.DisconnectionError(f"a pooled database connection is gone: {e}") from e

    return engine


def migrate(engine: Engine) -> None:
    """Bring the schema up to the newest revision (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Database:
    def __init__(self, url: str, *, clock: Clock = SYSTEM) -> None:
        self.url = url
        # What every transaction's session carries in ``Session.info``: the clock the control plane reads
        # time from, and services it reaches without I/O inside a transaction (the rendezvous host).
        self.info: dict[str, Any] = {"clock": clock}
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.generation = 0  # bumped at every commit: waiters compare it
        self.action_generation = 0  # bumped at commits that created agent actions (long-polls wait on it)

    def migrate(self) -> None:
        migrate(self.engine)

    @contextmanager
    def tx(self, *, notify: bool = True) -> Iterator[Session]:
        """One serialised transaction; ``notify=False`` for bookkeeping (leases, logs) nobody waits on."""
        with self.lock:
            with self.sessions() as s, s.begin():
                s.info.update(self.info)
                yield s
                new_actions = bool(s.info.get("new_actions"))
            if new_actions:
                self.action_generation += 1
            if notify or new_actions:
                self.generation += 1
                self.changed.notify_all()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self.lock, self.sessions() as s:
            s.info.update(self.info)
            yield s

    def close(self) -> None:
        self.engine.dispose()
