"""The control plane's time, read through the database session it works in.

Every function of the control plane that changes state takes the session ``s``; its clock rides along in
``s.info`` (put there by the session factory, :func:`use`), so that no call site has to pass a clock and
a test can set the hour for a whole database. A session without one reads the machine's clock."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from tidal.core.clock import SYSTEM, Clock

KEY = "clock"


def clock(s: Session) -> Clock:
    """The clock the session's work reads."""
    c = s.info.get(KEY)
    return c if c is not None else SYSTEM


def now(s: Session) -> float:
    """Wall time (seconds since the epoch) as the session's clock tells it."""
    return clock(s).time()


def use(sessions: sessionmaker[Session], c: Clock) -> None:
    """Every session ``sessions`` makes from now on reads time from ``c``."""
    sessions.configure(info={KEY: c})
