"""Who is calling: every route authenticates with a bearer token, and each role may use its own routes
(users and admins: jobs; admins: users; agents: /v1/agent/*, each node credential for its node only).

The dashboard (``/ui``) logs in once and its browser then sends the token in an HttpOnly cookie
(:data:`COOKIE`), which stands for the bearer header. A cross-site page could make the browser send that
cookie, so a request that changes anything and authenticates by the cookie alone must also carry
:data:`UI_HEADER` (a custom header: a cross-site page cannot set one without a CORS preflight, which this
server never grants) and, where the browser says where it comes from (``Origin``), come from this server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import Depends, Header, Request

from tidal.control import tokens, userlimits, usertokens
from tidal.control.api.context import Context, Ctx
from tidal.core.clock import SYSTEM, Clock
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


#: How long a cached principal is served without looking at the database again: a token revoked by another
#: API process (sharing the database) is refused within this time; by this one, at once.
RECHECK_S = 1.0
#: A token's ``last_used_at`` is written at most this often (never a write per request).
TOUCH_EVERY_S = 60.0
#: Tokens cached at most (the oldest looked-up are dropped first: they are looked up again when used).
MAX_KNOWN = 100_000


@dataclass
class Known:
    """A token looked up: who it is, until when it works (wall time; None: until revoked), when it was last
    checked against the database (monotonic), and its user's request rate (None: no limit) and burst."""

    principal: Principal
    token_id: str
    expires_at: float | None
    checked_at: float
    rate: float | None
    burst: int

    def works(self, wall: float) -> bool:
        return self.expires_at is None or wall < self.expires_at


class Principals:
    """Who each token is, once looked up (token digest → :class:`Known`). An entry is served while its token
    has not expired and for :data:`RECHECK_S` after it was checked; then the database is read again (so a
    revocation made by another API process is seen within that time). A revocation here forgets the token's
    entry: a token looked up while it was being revoked is not kept either (the generation changed
    meanwhile)."""

    def __init__(self) -> None:
        self.known: dict[str, Known] = {}
        self.generation = 0

    def put(self, key: str, entry: Known, generation: int) -> None:
        if generation != self.generation:
            return
        self.known.pop(key, None)  # re-inserted last: the dict's order is that of the lookups
        self.known[key] = entry
        while len(self.known) > MAX_KNOWN:
            del self.known[next(iter(self.known))]

    def forget(self) -> None:
        self.generation += 1
        self.known = {}

    def forget_where(self, *, user: str | None = None, token_id: str | None = None) -> None:
        """Forget the entries of a user, or of a token (its limits changed, it was revoked)."""
        self.generation += 1
        # A copy of the items first (one step for the interpreter): a route's thread may call this while the
        # event loop adds an entry.
        self.known = {k: e for k, e in list(self.known.items())
                      if e.principal.name != user and e.token_id != token_id}


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


def clock_of(ctx: Context) -> Clock:
    return cast(Clock, ctx.db.info.get("clock", SYSTEM))


async def principal(request: Request, ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> Principal:
    token = bearer(authorization) if authorization or COOKIE not in request.cookies else cookie_token(request)
    if not token:
        raise Unauthorized("missing API token", hint="send 'Authorization: Bearer TOKEN'")
    key = tokens.digest(token)
    cache: Principals = request.app.state.principals
    clock = clock_of(ctx)
    wall, mono = clock.time(), clock.monotonic()
    entry = cache.known.get(key)
    if entry is not None and entry.works(wall) and 0.0 <= mono - entry.checked_at < RECHECK_S:
        return entry.principal
    generation = cache.generation
    with ctx.db.read() as s:
        try:
            u, row = tokens.authenticate(s, token)
        except Unauthorized:
            cache.known.pop(key, None)
            raise
        rate, burst = userlimits.request_rate(s, u)
        entry = Known(Principal(u.name, u.role), row.id, row.expires_at, mono, rate, burst)
        used = row.last_used_at
    if used is None or wall - used >= TOUCH_EVERY_S:
        with ctx.db.tx(notify=False) as s:
            usertokens.touch(s, entry.token_id, wall)
    cache.put(key, entry, generation)
    return entry.principal


def forget_principals(request: Request, *, user: str | None = None, token_id: str | None = None) -> None:
    """After a credential was revoked or replaced: every token is looked up again (``user``, ``token_id``: only
    that user's, or that token)."""
    cache: Principals = request.app.state.principals
    if user is None and token_id is None:
        cache.forget()
    else:
        cache.forget_where(user=user, token_id=token_id)


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
