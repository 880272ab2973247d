"""A control plane's first start: its state directory, the database schema, and the tokens it hands out
written owner-only under ``TIDAL_HOME/tokens``. ``tidal up`` makes the admin, user and cluster tokens;
``tidal server`` only the admin's (nodes join with join tokens, users are made by the admin)."""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence
from pathlib import Path

from tidal.config import Settings
from tidal.control import tokens
from tidal.control.clusterfile import token_path
from tidal.control.store.db import Database
from tidal.control.store.models import User

TOKENS = ("admin", "user", "cluster")
#: The limits of the user `tidal up` makes (tidal.control.userlimits; None: no limit): none on its requests and
#: its queued jobs.
LOCAL_USER_LIMITS = {"rate": None, "max_queued": None}


def bootstrap(settings: Settings, who: Sequence[str] = TOKENS) -> None:
    """Create the database schema and, once, the tokens of ``who`` (owner-only files)."""
    home = Path(settings.home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_dir(home / "tokens")
    private_dir(home / "logs")
    db = Database(settings.db_url)
    try:
        db.migrate()
        unix = getpass.getuser()
        for kind in who:
            path = token_path(home, kind)
            if path.exists():
                continue
            name, role = {"admin": ("admin", "admin"), "user": (unix, "user"),
                          "cluster": (tokens.CLUSTER_AGENT, "agent")}[kind]
            with db.tx() as s:
                old = s.get(User, name)
                if old is not None:  # its token file was lost: issue a new token
                    tokens.remove_account(s, old)
                # Run as root, `tidal up` makes a user whose jobs run as root: its caller's choice, on their own
                # machine.
                token = tokens.create_user(s, name, role, unix if role != "agent" else None, allow_root=True)
                if kind == "user":  # one person's cluster (`tidal up`): no neighbour to protect from its user
                    user = s.get(User, name)
                    assert user is not None
                    user.limits = dict(LOCAL_USER_LIMITS)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
    finally:
        db.close()


def private_dir(path: Path) -> None:
    """A directory of secrets (tokens, logs) that only its owner may enter, also one an older version
    made with the caller's umask."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
