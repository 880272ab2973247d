"""The database: engine, schema migration (Alembic) and serialised transactions.

The control plane is one process; every change runs in :meth:`Database.tx` under one lock, so SQLite
never sees two writers and the reconcile loop and the API never interleave half-made decisions. The
lock's condition wakes long-polling agents and the reconcile loop after each commit. Agents' transactions
(``tx(urgent=True)``: heartbeats, results) go before users' at that lock, so that a flood of submissions
never delays the renewal of a node's lease. Reads (:meth:`Database.read`) take no lock: SQLite (WAL) and
PostgreSQL give each a consistent view while a writer commits.

A database server that restarts or cannot be reached fails the transactions of the meanwhile with
:class:`tidal.errors.Unavailable` (the API answers 503 with its message, and the request may be tried
again); the next transaction connects again (the pool tests a connection before handing it out).
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tidal.core.clock import SYSTEM, Clock
from tidal.errors import Unavailable

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
# SQLite's companions of a database file: they hold the same rows.
SQLITE_FILES = ("", "-wal", "-shm", "-journal")
#: ``Session.info`` key of a transaction's hooks, each called with the session just before it commits: what
#: code writes behind (rows it adds many of, inserted together at the end; see tidal.control.history).
BEFORE_COMMIT = "before_commit"
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
    engine = create_engine(url, connect_args=network_timeouts(url))

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
            raise PooledConnectionGone(f"a pooled database connection is gone: {e}") from e

    return engine


class PooledConnectionGone(Unavailable, DisconnectionError):
    """A connection taken from the pool failed its test. Raised in the pool's checkout hook, where SQLAlchemy
    takes a DisconnectionError as "discard it and try another connection": the caller never sees it unless
    no connection can be made at all."""


#: libpq settings that bound how long the control plane waits for a database it cannot reach: connecting,
#: and any request on a connection whose packets are dropped (without them the kernel's TCP retransmission
#: timeout, about 15 minutes, would hold every transaction, agents' heartbeats included, behind one lock).
PG_TIMEOUTS = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
               "keepalives_count": 3, "tcp_user_timeout": 10_000}


def network_timeouts(url: str) -> dict[str, Any]:
    """:data:`PG_TIMEOUTS` for a PostgreSQL URL, but where the URL sets one itself (``?connect_timeout=20``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return {}
    return {k: v for k, v in PG_TIMEOUTS.items() if k not in parsed.query}


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
        # Urgent transactions waiting for the lock: while there are any, others wait to ask for it.
        self._urgent = 0
        self._gate = threading.Condition(threading.Lock())
        self.generation = 0  # bumped at every commit: waiters compare it
        self.action_generation = 0  # bumped at commits that created agent actions (long-polls wait on it)
        # Called (from the committing thread) after each commit that created agent actions, with the nodes they
        # are for: the API's long-polls, which wait on its event loop rather than on ``changed``.
        self.on_actions: list[Callable[[frozenset[str]], None]] = []

    def migrate(self) -> None:
        migrate(self.engine)

    @contextmanager
    def tx(self, *, notify: bool = True, urgent: bool = False) -> Iterator[Session]:
        """One serialised transaction; ``notify=False`` for bookkeeping (leases, logs) nobody waits on;
        ``urgent`` for the agents' (it takes the lock before any waiting transaction that is not).
        Raises :class:`Unavailable` where the database cannot be reached (``in_doubt`` where the connection
        was lost at the commit itself)."""
        committing = [False]
        with self._locked(urgent):
            with _unavailable(committing), self.sessions() as s, s.begin():
                s.info.update(self.info)
                hooks: list[Callable[[Session], None]] = []
                s.info[BEFORE_COMMIT] = hooks
                yield s
                for hook in hooks:  # rows written behind (events, submissions): in one statement each
                    hook(s)
                s.flush()  # what fails here was not made; only the COMMIT itself leaves it in doubt
                new_actions = frozenset(s.info.get("new_actions") or ())
                committing[0] = True
            if new_actions:
                self.action_generation += 1
            if notify or new_actions:
                self.generation += 1
                self.changed.notify_all()
        if new_actions:
            for wake in self.on_actions:
                wake(new_actions)

    @contextmanager
    def _locked(self, urgent: bool) -> Iterator[None]:
        # A thread that holds the lock already (a transaction inside a long-poll's wait on ``changed``) takes
        # it again at once: waiting at the gate would wait for an urgent transaction that waits for it.
        nested = self.lock._is_owned()  # type: ignore[attr-defined]
        if urgent and not nested:
            with self._gate:
                self._urgent += 1
        elif not nested:
            with self._gate:
                self._gate.wait_for(lambda: not self._urgent)
        try:
            self.lock.acquire()
        finally:
            if urgent and not nested:
                with self._gate:
                    self._urgent -= 1
                    if not self._urgent:
                        self._gate.notify_all()
        try:
            yield
        finally:
            self.lock.release()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with _unavailable([False]), self.sessions() as s:
            s.info.update(self.info)
            yield s

    def close(self) -> None:
        self.engine.dispose()


def write_behind(s: Session, key: str, write: Callable[[Session, list[dict[str, Any]]], None],
                 row: dict[str, Any]) -> None:
    """Add ``row`` to the rows of ``key`` that this transaction writes just before it commits, all in one
    statement (``write(s, rows)``), in the order added; outside a transaction of :meth:`Database.tx` (no
    hooks), write it now. For rows added many at a time and not read back before the commit (or only after
    :func:`flush_behind`)."""
    rows: list[dict[str, Any]] | None = s.info.get(key)
    if rows is None:
        hooks = s.info.get(BEFORE_COMMIT)
        if hooks is None:
            write(s, [row])
            return
        rows = s.info[key] = []
        hooks.append(functools.partial(flush_behind, key=key, write=write))
    rows.append(row)


def flush_behind(s: Session, key: str, write: Callable[[Session, list[dict[str, Any]]], None]) -> None:
    """Write now what this transaction holds back of ``key`` (before a query that must see those rows)."""
    rows: list[dict[str, Any]] | None = s.info.get(key)
    if rows:
        write(s, list(rows))
        rows.clear()


def lost_connection(exc: BaseException) -> bool:
    """Whether a database error is one of the database's state rather than of the statement: a driver's
    operational or interface error (the server could not be reached or went away: a restart, a network
    fault; PostgreSQL shutting down or starting up; a serialisation failure; SQLite's lock timeout), or one
    SQLAlchemy found to have broken the connection. Each may pass on trying again."""
    return isinstance(exc, OperationalError | InterfaceError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated)


@contextmanager
def _unavailable(committing: list[bool]) -> Iterator[None]:
    """Turn a lost connection into :class:`Unavailable`. Its message does not quote the driver's (which
    names the database's host): the control plane's log does."""
    try:
        yield
    except DBAPIError as exc:
        if not lost_connection(exc):
            raise
        why = str(exc.orig if exc.orig is not None else exc).strip().splitlines()
        log.warning("database unavailable%s: %s", " at a commit" if committing[0] else "",
                    why[0] if why else type(exc).__name__)
        if committing[0]:
            raise Unavailable("the control plane lost its database while committing the change: it may or may "
                              "not have been made", hint="look (e.g. `tidal ls`) before trying again",
                              in_doubt=True) from exc
        raise Unavailable("the control plane's database is unavailable: the request was not carried out",
                          hint="try again in a moment", in_doubt=False) from exc
