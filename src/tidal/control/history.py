"""The event log: every state change and every decision lands here with its cause."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.store.db import write_behind
from tidal.control.store.models import EventRow

_INSERT = insert(EventRow)  # one statement, compiled once; the values travel as parameters


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def record(s: Session, kind: str, *, job_id: str | None = None, node: str | None = None,
           cause: str | None = None, detail: str = "") -> str:
    """Append an event; returns its id, to be the cause of what follows from it. Events are never read back in
    the transaction that writes them: in one of :meth:`Database.tx`, they are inserted together (one statement)
    just before it commits, in the order recorded."""
    eid = new_id("e")
    values = {"id": eid, "time": now(s), "kind": kind, "job_id": job_id, "node": node, "cause": cause,
              "detail": detail}
    write_behind(s, _EVENTS, _write_events, values)
    return eid


_EVENTS = "events"


def _write_events(s: Session, rows: list[dict[str, Any]]) -> None:
    s.execute(_INSERT, rows)
