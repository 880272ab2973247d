"""The control plane's time, read through the clock of the transaction's database (tests inject one)."""

from __future__ import annotations

from typing import cast

from sqlalchemy.orm import Session

from tidal.core.clock import SYSTEM, Clock


def clock(s: Session) -> Clock:
    return cast(Clock, s.info.get("clock", SYSTEM))


def now(s: Session) -> float:
    """Wall time, as stored in the database and shown to users."""
    return clock(s).time()
