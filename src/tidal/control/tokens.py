"""API tokens: random secrets given once to their holder; the database keeps only their sha256."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.store.models import User
from tidal.core.limits import MAX_ID_CHARS
from tidal.errors import Conflict, ValidationError

ROLES = ("admin", "user", "agent")
# The agent credential of the whole cluster (`tidal up` gives it to every agent): it may act for any
# node. Any other agent user is one node's own credential, named after the node, for that node only.
CLUSTER_AGENT = "cluster"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_user(s: Session, name: str, role: str, unix_user: str | None = None) -> str:
    """Create a user and return its token (shown once)."""
    if role not in ROLES:
        raise ValidationError(f"unknown role {role!r}", field="role", hint="one of " + ", ".join(ROLES))
    if not name or len(name) > MAX_ID_CHARS or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValidationError(f"bad user name {name!r}", field="name",
                              hint=f"letters, digits, '-', '_' and '.', at most {MAX_ID_CHARS}")
    if s.get(User, name) is not None:
        raise Conflict(f"user {name} exists", field="name")
    token = f"tdl_{secrets.token_urlsafe(32)}"
    s.add(User(name=name, role=role, token_hash=digest(token), unix_user=unix_user, created_at=now(s)))
    return token


def lookup(s: Session, token: str) -> User | None:
    return s.scalar(select(User).where(User.token_hash == digest(token)))
