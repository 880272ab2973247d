"""Who is calling: every route authenticates with a bearer token, and each role may use its own routes
(users and admins: jobs; admins: users; agents: /v1/agent/*, each node credential for its node only).

The dashboard (``/ui``) logs in once and its browser then sends the token in an HttpOnly cookie
(:data:`COOKIE`), which stands for the bearer header. A cross-site page could make the browser send that
cookie, so a request that changes anything and authenticates by the cookie alone must also carry
:data:`UI_HEADER` (a custom header: a cross-site page cannot set one without a CORS preflight, which this
server never grants) and, where the browser says where it comes from (``Origin``), come from this server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from tidal.control import tokens
from tidal.control.api.context import Ctx
from tidal.errors import Forbidden, Unauthorized, shown


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


#: The dashboard's session cookie: the API token, HttpOnly, SameSite=Strict.
COOKIE = "tidal_token"
#: The header the dashboard's requests that change anything carry (CSRF: see above).
UI_HEADER = "X-Tidal-UI"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def cookie_token(request: Request) -> str | None:
    """The dashboard's token from its cookie, where the request may be authenticated by it."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    if request.method not in SAFE_METHODS:
        if request.headers.get(UI_HEADER) != "1":
            raise Forbidden(f"a request that changes anything and is authenticated by the dashboard's cookie must "
                            f"carry the header {UI_HEADER}: 1", hint="send it from the dashboard, or use "
                            "'Authorization: Bearer TOKEN'")
        origin = request.headers.get("origin")
        if origin is not None and not same_origin(request, origin):
            raise Forbidden(f"cross-site request from {shown(origin)} refused", hint="use the dashboard itself")
    return token


def same_origin(request: Request, origin: str) -> bool:
    host = request.headers.get("host", "")
    return origin.rstrip("/") in (f"{request.url.scheme}://{host}", f"http://{host}", f"https://{host}")


async def principal(request: Request, ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> Principal:
    token = bearer(authorization) if authorization or COOKIE not in request.cookies else cookie_token(request)
    if not token:
        raise Unauthorized("missing API token", hint="send 'Authorization: Bearer TOKEN'")
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
