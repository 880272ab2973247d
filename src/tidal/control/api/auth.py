"""Who is calling: every route authenticates with a bearer token, and each role may use its own routes
(users and admins: jobs; admins: users; agents: /v1/agent/*, each node credential for its node only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from tidal.control import tokens
from tidal.control.api.context import Ctx
from tidal.errors import Forbidden, Unauthorized


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def owner_filter(self) -> str | None:
        """Whose jobs this principal may see: None for an admin (everyone's)."""
        return None if self.role == "admin" else self.name


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer TOKEN`` header."""
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("missing API token", hint="send 'Authorization: Bearer TOKEN'")
    return authorization.removeprefix("Bearer ").strip()


class Principals:
    """Who each token is, once looked up (token digest → Principal). A revocation forgets them all: a token
    looked up while it was being revoked is not kept either (the generation changed meanwhile)."""

    def __init__(self) -> None:
        self.known: dict[str, Principal] = {}
        self.generation = 0

    def forget(self) -> None:
        self.generation += 1
        self.known = {}


async def principal(request: Request, ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> Principal:
    token = bearer(authorization)
    key = tokens.digest(token)
    cache: Principals = request.app.state.principals
    p = cache.known.get(key)
    if p is None:
        generation = cache.generation
        with ctx.db.read() as s:
            u = tokens.lookup(s, token)
            if u is None:
                raise Unauthorized("invalid API token: unknown, or revoked",
                                   hint="ask an admin for a token; a node whose credential was revoked joins again "
                                        "with a new join token (`tidal token create --node NODE`)")
            p = Principal(u.name, u.role)
        if cache.generation == generation:
            cache.known[key] = p
    return p


def forget_principals(request: Request) -> None:
    """After a credential was revoked or replaced: every token is looked up again."""
    cache: Principals = request.app.state.principals
    cache.forget()


async def _user(p: Annotated[Principal, Depends(principal)]) -> Principal:
    if p.role not in ("user", "admin"):
        raise Forbidden("this token may not manage jobs")
    return p


async def _admin(p: Annotated[Principal, Depends(principal)]) -> Principal:
    if p.role != "admin":
        raise Forbidden("this needs an admin token")
    return p


async def _agent(p: Annotated[Principal, Depends(principal)]) -> Principal:
    if p.role != "agent":
        raise Forbidden("this needs the cluster (agent) token")
    return p


def for_node(p: Principal, node: str) -> None:
    """The cluster's agent credential acts for any node; any other agent credential is one node's own
    (its user name is the node's name) and acts for that node only."""
    if p.name not in (tokens.CLUSTER_AGENT, node):
        raise Forbidden(f"this credential is node {p.name}'s: it cannot act for node {node}", field="node",
                        hint="use the node's own token, or the cluster token")


AnyToken = Annotated[Principal, Depends(principal)]
User = Annotated[Principal, Depends(_user)]
Admin = Annotated[Principal, Depends(_admin)]
Agent = Annotated[Principal, Depends(_agent)]
