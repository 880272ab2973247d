"""The dashboard (docs/dashboard.md): its page and assets under ``/ui``, its log-in (the API token into an
HttpOnly, SameSite=Strict cookie that :mod:`tidal.control.api.auth` accepts in place of the bearer header), and
the two views of the cluster the other routes do not give: every device with the tier of the job on it and
the figures of the moment (utilisation, goodput, SLA attainment, queueing, preemptions), and the jobs with
their progress. Users see their own jobs; the cluster's devices and figures are everyone's, but another
user's job on a device is shown by its tier only."""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from tidal.control import jobs, tokens
from tidal.control.api import views
from tidal.control.api.auth import COOKIE, UI_HEADER, User, same_origin
from tidal.control.api.context import Ctx
from tidal.control.api.overview import overview
from tidal.control.api.trend import Trend
from tidal.control.store.models import JobRow
from tidal.core import limits
from tidal.errors import Forbidden, NotFound, Unauthorized, shown

router = APIRouter()

#: The files of the dashboard (tidal/control/ui), by the name the page asks for, and their media type.
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
#: What the page may do: its own scripts and styles, and requests to this server; nothing from elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: Tokens are ~43 characters: a longer one is no token (and is not looked up).
MAX_TOKEN = 256


def _asset(name: str) -> bytes:
    return resources.files("tidal.control.ui").joinpath(name).read_bytes()


def _page(body: bytes, media_type: str) -> Response:
    return Response(body, media_type=media_type, headers={
        "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache"})


@router.get("/ui", include_in_schema=False)
@router.get("/ui/", include_in_schema=False)
def index() -> Response:
    """The page itself holds no data: it asks the API, with the cookie, once logged in."""
    return _page(_asset("index.html"), "text/html; charset=utf-8")


@router.get("/ui/static/{name}", include_in_schema=False)
def asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound(f"no dashboard file {shown(name)}")
    return _page(_asset(name), ASSETS[name])


class Login(BaseModel):
    token: str = Field(min_length=1, max_length=MAX_TOKEN)


@router.post("/ui/login")
def login(body: Login, request: Request, ctx: Ctx) -> JSONResponse:
    """The token, checked, into the session cookie. Only from the dashboard (its header, its origin)."""
    if request.headers.get(UI_HEADER) != "1":
        raise Forbidden(f"log in from the dashboard (the request lacks {UI_HEADER}: 1)")
    origin = request.headers.get("origin")
    if origin is not None and not same_origin(request, origin):
        raise Forbidden(f"cross-site log-in from {shown(origin)} refused")
    with ctx.db.read() as s:
        u = tokens.lookup(s, body.token.strip())
        if u is None:
            raise Unauthorized("invalid API token: unknown, or revoked",
                               hint="use the token `tidal up` wrote (TIDAL_HOME/tokens/user.token) or one an "
                                    "admin made for you")
        if u.role not in ("user", "admin"):
            raise Forbidden(f"a token of role {u.role} cannot use the dashboard: log in with a user's or an "
                            f"admin's token")
        who = {"name": u.name, "role": u.role}
    r = JSONResponse(who)
    r.set_cookie(COOKIE, body.token.strip(), httponly=True, samesite="strict", path="/",
                 secure=request.url.scheme == "https")
    return r


@router.post("/ui/logout")
def logout(request: Request) -> JSONResponse:
    if request.headers.get(UI_HEADER) != "1":
        raise Forbidden(f"log out from the dashboard (the request lacks {UI_HEADER}: 1)")
    r = JSONResponse({"logged_out": True})  # the token itself stays valid: revoking it is an admin's
    r.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return r


@router.get("/v1/ui/jobs")
def job_rows(p: User, ctx: Ctx, all_users: Annotated[bool, Query(alias="all")] = True,
             limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE)] = 500) -> list[dict[str, Any]]:
    """The jobs table: what ``GET /v1/jobs`` shows, with progress (steps, steps/s) and devices held. An
    admin sees everyone's (unless ``all=false``), a user their own."""
    with ctx.db.read() as s:
        q = select(JobRow).order_by(JobRow.seq.desc()).limit(limit)
        if p.owner_filter is not None or not all_users:
            q = q.where(JobRow.owner == p.name)
        out = []
        for j in s.scalars(q):
            prog = j.progress or {}
            out.append({**views.summary(j), "steps": prog.get("steps"), "steps_per_s": prog.get("steps_per_s"),
                        "devices": len({(d.node, d.index) for d in jobs.held_devices(j)}),
                        "started_at": j.started_at, "finished_at": j.finished_at})
        return out


@router.get("/v1/ui/cluster")
async def cluster(request: Request, p: User, ctx: Ctx) -> dict[str, Any]:
    """Every node (by region and cluster) and device with the job on it, the figures of the moment and their
    trend (``trend``: the samples of :mod:`tidal.control.api.trend`, oldest first)."""
    out = await run_in_threadpool(overview, ctx.db, p.owner_filter)
    trend: Trend = request.app.state.trend
    trend.offer(out)
    out["trend"] = trend.samples()
    return out
