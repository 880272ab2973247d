"""Where the ranks of distributed jobs (re)build their torch.distributed group: a store hosted by the
control plane (not by rank 0, which may move), started or adopted *before* a transaction needs it, so
that no transaction waits on a process start."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control.store.db import Database
from tidal.control.store.models import JobRow
from tidal.core import TERMINAL, protocol
from tidal.errors import TidalError

log = logging.getLogger(__name__)


class RendezvousHost:
    """The control plane's rendezvous store server. :meth:`prepare` (outside any transaction) starts it,
    adopts the one a predecessor left, or restarts it if it died, once some distributed job needs it;
    :meth:`addr` (inside transactions) only reads the address found then. ``advertise``: the control plane's
    address as the nodes reach it (the store listens on every address of its host; ranks on other hosts
    must be given one they can route to, never loopback)."""

    def __init__(self, advertise: str = "127.0.0.1") -> None:
        self.advertise = advertise
        self._addr: str | None = None
        self._mu = threading.Lock()
        # The database's generation when no store was found needed (or none could be started): nothing to
        # look at again until something commits.
        self._idle_at: int | None = None

    def prepare(self, db: Database) -> None:
        with self._mu:
            from tidal.mechanisms.interpose import storeserver

            if self._addr is not None and storeserver.shared_alive():
                return
            if self._addr is None and self._idle_at == db.generation:
                return
            self._idle_at = db.generation
            if self._addr is None and not _distributed_jobs(db):
                return
            self._start()

    def _start(self) -> None:
        """Under ``_mu``: start or adopt the store and note its address."""
        from tidal.mechanisms.interpose import storeserver

        try:
            self._addr = f"{self.advertise}:{storeserver.shared().port}"
            self._idle_at = None
        except (TidalError, OSError, ImportError) as exc:
            # No torch here: only scripts that use torch.distributed will miss it.
            log.warning("no rendezvous store for distributed jobs: %s", exc)
            self._addr = None

    def addr(self) -> str | None:
        return self._addr

    def ensure(self) -> str | None:
        """The store's address, the store started now if :meth:`prepare` has not yet: a distributed job
        committed just after a pass's :meth:`prepare` looked can be placed by that same pass. Starting the
        store inside that transaction is a rare wait; ranks launched without a store all fail."""
        with self._mu:
            if self._addr is None:
                self._start()
            return self._addr


def _distributed_jobs(db: Database) -> bool:
    with db.sessions() as s:  # a look without the writers' lock, as the reconcile loop's
        live = JobRow.state.not_in(tuple(t.value for t in TERMINAL))
        return s.scalar(select(JobRow.id).where(JobRow.ranks > 1, live).limit(1)) is not None


def rendezvous(s: Session, job: JobRow, tag: str) -> protocol.Rendezvous | None:
    """The store and the keys, unique to this build, on which the job's ranks build their group (None for a
    job of one rank, or when the control plane has no store)."""
    if job.ranks < 2:
        return None
    host = s.info.get("rendezvous")
    addr = host.ensure() if isinstance(host, RendezvousHost) else None
    if addr is None:
        log.warning("no rendezvous store for job %s", job.id)
        return None
    return protocol.Rendezvous(addr=addr, prefix=f"{job.id}/{job.attempt}/{tag}")
