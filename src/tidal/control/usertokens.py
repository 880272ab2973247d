"""Users' API tokens: several a user, each with an id (shown; the secret never is, after its creation), a
label, a time to live, revocable; a rotation gives a new secret with the same label and time to live and revokes
the old one. A user manages their own; an admin anyone's (a node's credential comes from a join token instead:
:mod:`tidal.control.tokens`).

A user holds at most :data:`MAX_LIVE` tokens that work, and keeps at most :data:`KEEP_DEAD` revoked or expired
ones listed (the oldest are forgotten as new ones are made): nothing grows without end."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from tidal.control import tokens
from tidal.control.clock import now
from tidal.control.store.models import User, UserToken
from tidal.errors import Conflict, Forbidden, NotFound, ValidationError

#: The longest time to live a token may be given (a token without one lasts until revoked).
MAX_TTL_S = 10 * 365 * 86400.0
MAX_LIVE = 100
KEEP_DEAD = 100
MAX_LABEL = 64


def _owner(s: Session, name: str) -> User:
    u = s.get(User, name)
    if u is None:
        raise NotFound(f"no user {name}", field="user", hint="`tidal user ls` lists them")
    if u.role == "agent":
        raise ValidationError(f"{name} is an agent credential: a node gets its own by joining with a join token",
                              field="user", hint=f"`tidal token create --node {name}`")
    return u


def may_manage(caller: str, caller_role: str, user: str) -> None:
    """A user manages their own tokens; an admin anyone's."""
    if caller_role != "admin" and caller != user:
        raise Forbidden(f"user {caller} may manage their own tokens only, not {user}'s", field="user",
                        hint="an admin manages other users' tokens")


def check_ttl(ttl_s: float | None) -> None:
    if ttl_s is not None and not 0 < ttl_s <= MAX_TTL_S:
        raise ValidationError(f"ttl: {ttl_s:g}s; a token lasts more than 0 s and at most {MAX_TTL_S / 86400:g} days",
                              field="ttl", hint="or give none: it then lasts until revoked")


def create(s: Session, user: str, *, label: str | None, ttl_s: float | None, by: str) -> tuple[UserToken, str]:
    """A new token of ``user`` (its row and the secret, shown once)."""
    _owner(s, user)
    check_ttl(ttl_s)
    if label is not None and (not label.isprintable() or len(label) > MAX_LABEL):
        raise ValidationError(f"bad label {label!r}: printable text of at most {MAX_LABEL} characters", field="label")
    t = now(s)
    rows = list(s.scalars(select(UserToken).where(UserToken.username == user).order_by(UserToken.created_at)))
    live = [r for r in rows if tokens.token_state(r, t) == "active"]
    if len(live) >= MAX_LIVE:
        raise Conflict(f"user {user} has {len(live)} tokens that work, the most a user may have", field="user",
                       hint="revoke some first: `tidal token ls --user NAME`, `tidal token revoke ID`")
    dead = [r.id for r in rows if tokens.token_state(r, t) != "active"]
    if len(dead) >= KEEP_DEAD:  # forget the oldest of those that no longer work
        s.execute(delete(UserToken).where(UserToken.id.in_(dead[:len(dead) - KEEP_DEAD + 1])))
    return tokens.issue(s, user, label=label, ttl_s=ttl_s, created_by=by)


def get(s: Session, token_id: str, caller: str, caller_role: str) -> UserToken:
    """A token the caller may manage (another user's is 404 to a user: its existence is not disclosed)."""
    row = s.get(UserToken, token_id) if tokens.TOKEN_ID.fullmatch(token_id) else None
    if row is None or (caller_role != "admin" and row.username != caller):
        raise NotFound(f"no token {token_id}", field="token",
                       hint="`tidal token ls --user NAME` lists a user's tokens (ids tk-...)")
    return row


def listing(s: Session, user: str) -> list[dict[str, Any]]:
    _owner(s, user)
    t = now(s)
    return [view(r, t) for r in s.scalars(select(UserToken).where(UserToken.username == user)
                                          .order_by(UserToken.created_at, UserToken.id))]


def view(r: UserToken, at: float) -> dict[str, Any]:
    """A token as listed: never its secret nor its hash."""
    return {"id": r.id, "user": r.username, "label": r.label, "created_at": r.created_at, "created_by": r.created_by,
            "expires_at": r.expires_at, "last_used_at": r.last_used_at, "revoked_at": r.revoked_at,
            "state": tokens.token_state(r, at)}


def revoke(s: Session, row: UserToken) -> UserToken:
    """Revoke a token (it stops working at once); one revoked already stays as it was."""
    if row.revoked_at is None:
        row.revoked_at = now(s)
    return row


def rotate(s: Session, row: UserToken, by: str) -> tuple[UserToken, str]:
    """A new token with the same user, label and time to live; ``row`` is revoked. A revoked token is not
    rotated (it was given up); an expired one is."""
    if row.revoked_at is not None:
        raise Conflict(f"token {row.id} was revoked: it is not rotated", field="token",
                       hint=f"make a new one: `tidal token create --user {row.username}`")
    _owner(s, row.username)
    new, secret = tokens.issue(s, row.username, label=row.label, ttl_s=row.ttl_s, created_by=by)
    row.revoked_at = now(s)
    return new, secret


def touch(s: Session, token_id: str, at: float) -> None:
    """Record that the token was used at ``at`` (the caller does it at most once a minute per token)."""
    s.execute(update(UserToken).where(UserToken.id == token_id).values(last_used_at=at))
