"""Users and their tokens (docs/cluster.md, Users, tokens and projects). Admins add, list, show, limit and
remove users; a user reads their own account (``GET /v1/me``) and manages their own tokens; an admin
anyone's. A token is shown once, when it is made; listed, it is its id, label, times and state."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sqlalchemy import select

from tidal.control import users, usertokens
from tidal.control.api.auth import Admin, AnyToken, Principal, User, forget_principals
from tidal.control.api.context import Ctx
from tidal.control.api.ratelimit import Buckets
from tidal.control.api.schemas import TokenCreate, UserCreate, UserLimits
from tidal.control.clock import now
from tidal.control.store.models import UserToken
from tidal.errors import Forbidden

router = APIRouter(prefix="/v1")


def _refused(request: Request, name: str) -> int:
    buckets: Buckets = request.app.state.buckets
    return buckets.refused.get(name, 0)


@router.post("/users", status_code=201)
def create_user(body: UserCreate, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """A user (with ``unix_user`` of uid 0 and role ``user``: only with ``allow_root``), a member of
    ``projects``; its first token, shown once."""
    with ctx.db.tx() as s:
        u, token = users.add(s, body.name, body.role, body.unix_user, allow_root=body.allow_root,
                             projects_=body.projects, by=p.name)
        token_id = s.scalar(select(UserToken.id).where(UserToken.username == u.name))
        return {"name": u.name, "role": u.role, "token": token, "token_id": token_id,
                "projects": users.view(s, u)["projects"]}


@router.get("/users")
def list_users(p: Admin, ctx: Ctx) -> list[dict[str, Any]]:
    with ctx.db.read() as s:
        return users.listing(s)


def _may_read(p: Principal, name: str) -> None:
    if p.role != "admin" and p.name != name:
        raise Forbidden(f"user {p.name} may read their own account only (`GET /v1/me`), not {name}'s",
                        hint="an admin reads any")


@router.get("/users/{name}")
def show_user(name: str, request: Request, p: AnyToken, ctx: Ctx) -> dict[str, Any]:
    """A user, their limits (each with its ``source``: ``user`` for an admin's override, else ``default``) and
    what they use: jobs waiting, devices held, requests refused over their rate (by this API process)."""
    _may_read(p, name)
    with ctx.db.read() as s:
        return users.view(s, users.get(s, name), _refused(request, name))


@router.get("/me")
def me(request: Request, p: AnyToken, ctx: Ctx) -> dict[str, Any]:
    """The caller's own account, as ``GET /v1/users/{name}``."""
    with ctx.db.read() as s:
        return users.view(s, users.get(s, p.name), _refused(request, p.name))


@router.patch("/users/{name}/limits")
def set_user_limits(name: str, body: UserLimits, request: Request, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Change a user's limits: each a number, ``"unlimited"``, or ``"default"`` (back to the default)."""
    with ctx.db.tx() as s:
        u = users.set_limits(s, name, body.model_dump(exclude_unset=True))
        out = users.view(s, u, _refused(request, name))
    forget_principals(request, user=name)  # its cached request rate
    return out


@router.delete("/users/{name}")
def remove_user(name: str, request: Request, p: Admin, ctx: Ctx,
                force: Annotated[bool, Query()] = False) -> dict[str, Any]:
    """Remove a user, their tokens and memberships: refused (409) while they have unfinished jobs, unless
    ``force``, which cancels them. Says what was done: ``cancelled`` jobs, ``tokens_revoked``, ``projects``."""
    with ctx.db.tx() as s:
        out = users.remove(s, name, by=p.name, force=force)
    forget_principals(request, user=name)
    buckets: Buckets = request.app.state.buckets
    buckets.forget(name)
    return out


# -- tokens ---------------------------------------------------------------------------------------------------
@router.post("/users/{name}/tokens", status_code=201)
def create_token(name: str, body: TokenCreate, p: User, ctx: Ctx) -> dict[str, Any]:
    """A new token of ``name`` (yours, or as an admin anyone's), shown once; ``ttl`` seconds (none: until
    revoked)."""
    usertokens.may_manage(p.name, p.role, name)
    with ctx.db.tx() as s:
        row, token = usertokens.create(s, name, label=body.label, ttl_s=body.ttl, by=p.name)
        return {**usertokens.view(row, now(s)), "token": token}


@router.get("/users/{name}/tokens")
def list_tokens(name: str, p: User, ctx: Ctx) -> list[dict[str, Any]]:
    """A user's tokens (``active``, ``expired`` or ``revoked``), oldest first; never a secret."""
    usertokens.may_manage(p.name, p.role, name)
    with ctx.db.read() as s:
        return usertokens.listing(s, name)


@router.post("/user-tokens/{token_id}/rotate", status_code=201)
def rotate_token(token_id: str, request: Request, p: User, ctx: Ctx) -> dict[str, Any]:
    """A new secret for the token's user, with its label and time to live (shown once: ``token``, its ``id``);
    the old token (``replaced``) is revoked at once."""
    with ctx.db.tx() as s:
        old = usertokens.get(s, token_id, p.name, p.role)
        row, token = usertokens.rotate(s, old, p.name)
        out = {**usertokens.view(row, now(s)), "token": token, "replaced": old.id}
    forget_principals(request, token_id=token_id)
    return out


@router.delete("/user-tokens/{token_id}")
def revoke_token(token_id: str, request: Request, p: User, ctx: Ctx) -> dict[str, Any]:
    """Revoke a token: refused from then on (by this API process at once; by others sharing the database within a
    second)."""
    with ctx.db.tx() as s:
        row = usertokens.revoke(s, usertokens.get(s, token_id, p.name, p.role))
        out = usertokens.view(row, now(s))
    forget_principals(request, token_id=token_id)
    return out
