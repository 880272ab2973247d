"""What the control plane needs of this machine, for ``tidal doctor``: a writable ``TIDAL_HOME`` (its
database, tokens and logs, and a local cluster's node roots) and, where ``TIDAL_DATABASE_URL`` asks for
it, a PostgreSQL server. The machine's own checks (kernel, CRIU, cgroups ...) are in
:mod:`tidal.mechanisms.checks`, whose :class:`Check` these return."""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tidal.config import load_settings
from tidal.mechanisms.checks import Check, Planned, need


def find_postgres(which: Callable[[str], str | None] = shutil.which,
                  pattern: str = "/usr/lib/postgresql/*/bin") -> str | None:
    """Directory holding ``postgres`` and ``initdb``: on PATH or under /usr/lib/postgresql/*/bin."""
    pg, initdb = which("postgres"), which("initdb")
    if pg and initdb:
        return str(Path(pg).parent)
    for d in sorted(glob.glob(pattern), reverse=True):
        if Path(d, "postgres").exists() and Path(d, "initdb").exists():
            return d
    return None


def check_postgres(db_url: str | None = None, found: str | Literal[False] | None = False) -> Check:
    db_url = os.environ.get("TIDAL_DATABASE_URL", "") if db_url is None else db_url
    needed = db_url.startswith("postgres")
    where = find_postgres() if found is False else found
    why = ("TIDAL_DATABASE_URL is postgresql" if needed
           else "only for TIDAL_DATABASE_URL=postgresql://...; default SQLite")
    if where:
        return Check("postgresql server", "ok", f"in {where}", required=needed)
    fix = ("install PostgreSQL (e.g. apt-get install postgresql) or put its bin directory on PATH" if needed
           else "nothing to do unless you want PostgreSQL: apt-get install postgresql")
    return Check("postgresql server", need(False, needed), f"postgres/initdb not found ({why})", fix, needed)


def check_home(home: Path | None = None) -> Check:
    source = "TIDAL_HOME" if os.environ.get("TIDAL_HOME") else "default"
    if home is None:
        home = load_settings().home
    existing = home
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    writable = os.access(existing, os.W_OK | os.X_OK) and existing.is_dir()
    state = "writable" if existing == home else f"to be created in {existing}"
    if writable:
        return Check("TIDAL_HOME", "ok", f"{home} ({source}; {state})", required=True)
    return Check("TIDAL_HOME", "missing", f"{home} ({source}) is not writable",
                 "set TIDAL_HOME to a writable directory", True)


def control_plane_checks() -> list[Planned]:
    """The control plane's checks, in display order."""
    return [Planned("postgresql server", False, check_postgres), Planned("TIDAL_HOME", True, check_home)]
