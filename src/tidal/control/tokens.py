"""API tokens: random secrets given once to their holder; the database keeps only their sha256.

A user (any role) holds one or more tokens (:class:`~tidal.control.store.models.UserToken`): each with an id
(shown, never the secret), a label, an optional time to live, revocable; :mod:`tidal.control.usertokens`
manages them. A node's agent holds a credential: the cluster's (``tidal up``), or the node's own (an agent user
named after the node). An admin gives a new node a **join token**: single-node, expiring, revocable, and used up
when the node's agent exchanges it for the node's own credential (:func:`join`). Revoking a node's credential
(:func:`revoke_node`) makes its agent's next call fail."""

from __future__ import annotations

import hashlib
import pwd
import re
import secrets

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.store.models import JoinToken, ProjectMember, User, UserToken
from tidal.core.limits import MAX_ID_CHARS
from tidal.errors import Conflict, Forbidden, NotFound, Unauthorized, ValidationError

ROLES = ("admin", "user", "agent", "metrics")  # metrics: reads GET /metrics and nothing else (a scraper's)
# The agent credential of the whole cluster (`tidal up` gives it to every agent): it may act for any
# node. Any other agent user is one node's own credential, named after the node, for that node only.
CLUSTER_AGENT = "cluster"
TOKEN_PREFIX = "tdl_"
JOIN_PREFIX = "tdj_"
#: A user token's id (``tk-`` and 12 hex digits); a join token's is ``jt-``.
TOKEN_ID = re.compile(r"tk-[0-9a-f]{12}")
#: How long a join token lasts unless its creator says otherwise, and the most it may last.
DEFAULT_JOIN_TTL_S = 24 * 3600.0
MAX_JOIN_TTL_S = 365 * 86400.0


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _check_name(name: str, field: str = "name") -> None:
    if not name or len(name) > MAX_ID_CHARS or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValidationError(f"bad {'node' if field == 'node' else 'user'} name {name!r}", field=field,
                              hint=f"letters, digits, '-', '_' and '.', at most {MAX_ID_CHARS}")


def runs_as_root(unix_user: str | None) -> bool:
    """Whether ``unix_user`` is an account of uid 0 on this host (``root``, or another name for it)."""
    if unix_user is None:
        return False
    try:
        return pwd.getpwnam(unix_user).pw_uid == 0
    except KeyError:
        return False


def create_user(s: Session, name: str, role: str, unix_user: str | None = None, *, allow_root: bool = False,
                created_by: str | None = None) -> str:
    """Create a user and return its first token (shown once). A user-role account whose jobs would run as
    root (``unix_user`` of uid 0) needs ``allow_root``."""
    if role not in ROLES:
        raise ValidationError(f"unknown role {role!r}", field="role", hint="one of " + ", ".join(ROLES))
    _check_name(name)
    if s.get(User, name) is not None:
        raise Conflict(f"user {name} exists", field="name")
    if role == "user" and runs_as_root(unix_user) and not allow_root:
        raise Forbidden(f"user {name}'s jobs would run as root (Unix account {unix_user!r} has uid 0): refused "
                        "without allow_root", field="unix_user",
                        hint="give the user an ordinary Unix account (--unix-user), or, if its jobs must run as root, "
                             "say so with --allow-root (API: \"allow_root\": true)")
    s.add(User(name=name, role=role, unix_user=unix_user, created_at=now(s), limits={}))
    s.flush()
    _, token = issue(s, name, label="initial", ttl_s=None, created_by=created_by)
    return token


def issue(s: Session, user: str, *, label: str | None, ttl_s: float | None,
          created_by: str | None) -> tuple[UserToken, str]:
    """A new token of ``user``, valid ``ttl_s`` seconds (None: until revoked): its row and the token (shown
    once)."""
    token = f"{TOKEN_PREFIX}{secrets.token_urlsafe(32)}"
    t = now(s)
    row = UserToken(id=f"tk-{secrets.token_hex(6)}", username=user, token_hash=digest(token), label=label,
                    ttl_s=ttl_s, created_at=t, created_by=created_by,
                    expires_at=None if ttl_s is None else t + ttl_s)
    s.add(row)
    return row, token


def token_state(row: UserToken, at: float) -> str:
    """``active``, ``revoked`` or ``expired``."""
    if row.revoked_at is not None:
        return "revoked"
    return "expired" if row.expires_at is not None and at >= row.expires_at else "active"


UNKNOWN_HINT = ("ask an admin for a token; a node whose credential was revoked joins again with a new join token "
                "(`tidal token create --node NODE`)")


def authenticate(s: Session, token: str) -> tuple[User, UserToken]:
    """The user a token is, and the token's row; :class:`Unauthorized` for a token that is unknown, revoked or
    expired, saying which."""
    row = s.scalar(select(UserToken).where(UserToken.token_hash == digest(token)))
    u = s.get(User, row.username) if row is not None else None
    if row is None or u is None:
        raise Unauthorized("invalid API token: unknown, or revoked", hint=UNKNOWN_HINT)
    t = now(s)
    state = token_state(row, t)
    if state == "revoked":
        raise Unauthorized(f"API token {row.id} of user {u.name} was revoked", hint="use another of your tokens, or "
                           "make a new one (`tidal token create --user NAME`; an admin's for another user)")
    if state == "expired":
        assert row.expires_at is not None
        raise Unauthorized(f"API token {row.id} of user {u.name} expired {t - row.expires_at:.0f}s ago",
                           hint="make a new one (`tidal token create --user NAME`), or rotate it (`tidal token "
                                "rotate ID`) before it expires")
    return u, row


def lookup(s: Session, token: str) -> User | None:
    """The user whose token this is, while it works (not revoked, not expired)."""
    try:
        return authenticate(s, token)[0]
    except Unauthorized:
        return None


def remove_account(s: Session, u: User) -> int:
    """Delete a user with its tokens and project memberships; how many of its tokens worked until now."""
    t = now(s)
    live = sum(1 for r in s.scalars(select(UserToken).where(UserToken.username == u.name))
               if token_state(r, t) == "active")
    s.execute(delete(UserToken).where(UserToken.username == u.name))
    s.execute(delete(ProjectMember).where(ProjectMember.username == u.name))
    s.delete(u)
    s.flush()
    return live


# -- join tokens and node credentials ---------------------------------------------------------------------
def _node_user(s: Session, node: str, *, hint: str) -> User | None:
    """The agent user that is ``node``'s own credential, if it has one. A node's name must not be another kind
    of user's, nor the cluster credential's (``hint``: what to do instead)."""
    _check_name(node, "node")
    if node == CLUSTER_AGENT:
        raise ValidationError(f"{CLUSTER_AGENT!r} is the cluster credential's name, not a node's", field="node",
                              hint=hint)
    u = s.get(User, node)
    if u is not None and u.role != "agent":
        raise Conflict(f"{node} is the name of a user ({u.role}), not a node's", field="node", node=node, hint=hint)
    return u


def _node_may_join(s: Session, node: str) -> None:
    _node_user(s, node, hint="give the node another name")


def create_join(s: Session, node: str, ttl_s: float, created_by: str) -> tuple[JoinToken, str]:
    """A new join token for ``node``, valid for ``ttl_s`` seconds: its row and the token (shown once)."""
    if not 0 < ttl_s <= MAX_JOIN_TTL_S:
        raise ValidationError(f"ttl: {ttl_s:g}s; a join token lasts more than 0 s and at most "
                              f"{MAX_JOIN_TTL_S / 86400:g} days", field="ttl")
    _node_may_join(s, node)
    token = f"{JOIN_PREFIX}{secrets.token_urlsafe(32)}"
    t = now(s)
    row = JoinToken(id=f"jt-{secrets.token_hex(6)}", node=node, token_hash=digest(token), created_by=created_by,
                    created_at=t, expires_at=t + ttl_s)
    s.add(row)
    return row, token


def join_state(row: JoinToken, at: float) -> str:
    """``active``, ``used``, ``revoked`` or ``expired``."""
    if row.revoked_at is not None:
        return "revoked"
    if row.used_at is not None:
        return "used"
    return "expired" if at >= row.expires_at else "active"


def join(s: Session, token: str, node: str) -> str:
    """Exchange a join token for ``node``'s own credential (returned, shown once). The token is then used
    up; a credential the node had before stops working. A token that is unknown (401), or revoked, expired,
    used or another node's (403), is refused with a message saying which."""
    row = s.scalar(select(JoinToken).where(JoinToken.token_hash == digest(token)))
    if row is None:
        raise Unauthorized("unknown join token", hint="create one for this node with `tidal token create --node "
                           f"{node}` (as an admin) and give it to the agent with --join-token")
    t = now(s)
    state = join_state(row, t)
    again = f"create a new one with `tidal token create --node {row.node}`"
    if row.node != node:
        raise Forbidden(f"join token {row.id} is for node {row.node}, not {node}", field="node", node=node,
                        hint=f"start the agent with --name {row.node}, or create a join token for {node}")
    if state == "revoked":
        raise Forbidden(f"join token {row.id} for node {node} was revoked", node=node, hint=again)
    if state == "used":
        raise Forbidden(f"join token {row.id} for node {node} was already used: a join token is good for one "
                        "join", node=node,
                        hint=f"the agent that used it holds the node's credential; to join the node again, {again}")
    if state == "expired":
        raise Forbidden(f"join token {row.id} for node {node} expired {t - row.expires_at:.0f}s ago", node=node,
                        hint=again)
    _node_may_join(s, node)
    row.used_at = t
    old = s.get(User, node)
    if old is not None:  # the node joins again (re-installed, or its credential was lost): a new credential
        remove_account(s, old)
    return create_user(s, node, "agent")


def list_tokens(s: Session) -> list[dict[str, object]]:
    """Join tokens (every state) and agent credentials (nodes' own, and the cluster's), oldest first."""
    t = now(s)
    out: list[dict[str, object]] = [
        {"id": j.id, "kind": "join", "node": j.node, "created_at": j.created_at, "created_by": j.created_by,
         "expires_at": j.expires_at, "used_at": j.used_at, "revoked_at": j.revoked_at, "state": join_state(j, t)}
        for j in s.scalars(select(JoinToken).order_by(JoinToken.created_at))]
    out += [{"id": u.name, "kind": "cluster" if u.name == CLUSTER_AGENT else "node",
             "node": None if u.name == CLUSTER_AGENT else u.name, "created_at": u.created_at, "created_by": None,
             "expires_at": None, "used_at": None, "revoked_at": None, "state": "active"}
            for u in s.scalars(select(User).where(User.role == "agent").order_by(User.created_at))]
    return out


def revoke_join(s: Session, token_id: str) -> JoinToken:
    row = s.get(JoinToken, token_id)
    if row is None:
        raise NotFound(f"no join token {token_id}", hint="`tidal token ls` lists them; to revoke a node's "
                       "credential: `tidal token revoke --node NODE`")
    if row.revoked_at is None and row.used_at is None:
        row.revoked_at = now(s)
    return row


def revoke_node(s: Session, node: str) -> dict[str, object]:
    """Revoke ``node``'s own credential and its join tokens not yet used. What was revoked: whether it had a
    credential, and the join tokens' ids."""
    u = _node_user(s, node, hint="a node's name is the one its agent joined with: `tidal nodes` lists them")
    t = now(s)
    pending = [j for j in s.scalars(select(JoinToken).where(JoinToken.node == node))
               if join_state(j, t) == "active"]
    for j in pending:
        j.revoked_at = t
    if u is not None:
        remove_account(s, u)
    return {"node": node, "credential": u is not None, "join_tokens": [j.id for j in pending]}
