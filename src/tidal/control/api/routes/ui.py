"""The dashboard (docs/dashboard.md): its page and assets under ``/ui``, its log-in (the API token into an
HttpOnly, SameSite=Strict cookie that :mod:`tidal.control.api.auth` accepts in place of the bearer header), and
the two views of the cluster the other routes do not give: every device with the tier of the job on it and
the figures of the moment (utilisation, goodput, SLA attainment, queueing, preemptions), and the jobs with
their progress. Users see their own jobs; the cluster's devices and figures are everyone's, but another
user's job on a device is shown by its tier only."""

from __future__ import annotations

import json
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from tidal.control import jobs, metrics, tally, tokens
from tidal.control.api import views
from tidal.control.api.auth import COOKIE, UI_HEADER, Principal, User, same_origin
from tidal.control.api.context import Context, Ctx
from tidal.control.clock import now
from tidal.control.store.models import JobRow, NodeRow
from tidal.core import JobState, Tier, limits
from tidal.errors import Forbidden, NotFound, Unauthorized
from tidal.sim.metrics import weighted_attainment

router = APIRouter()

#: The files of the dashboard (tidal/control/ui), by the name the page asks for, and their media type.
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
#: What the page may do: its own scripts and styles, and requests to this server; nothing from elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: Tokens are ~43 characters: a longer one is no token (and is not looked up).
MAX_TOKEN = 256
WORKING = (JobState.RUNNING.value,)


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
        raise NotFound(f"no dashboard file {name!r}")
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
        raise Forbidden(f"cross-site log-in from {origin!r} refused")
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
async def cluster(p: User, ctx: Ctx) -> dict[str, Any]:
    """Every node (by region and cluster) and device with the job on it, and the figures of the moment."""
    return await run_in_threadpool(_cluster, ctx, p)


def _cluster(ctx: Context, p: Principal) -> dict[str, Any]:
    metrics.fold(ctx.db)  # the counters (preemptions by cause, queueing) are the folded event log's
    with ctx.db.read() as s:
        at = now(s)
        nodes = list(s.scalars(select(NodeRow).order_by(NodeRow.region, NodeRow.cluster, NodeRow.name)))
        on: dict[tuple[str, int], dict[str, Any]] = {}
        active = [st.value for st in jobs.ACTIVE]
        for j in s.scalars(select(JobRow).where(JobRow.state.in_(active))):
            mine = p.owner_filter is None or j.owner == p.name
            for d in jobs.held_devices(j):
                on[(d.node, d.index)] = {"tier": j.tier, "state": j.state, **(
                    {"job": j.id, "name": j.name, "owner": j.owner} if mine else {"job": None})}
        total = used = working = 0
        out_nodes = []
        for n in nodes:
            devs = [{"index": i, **on.get((n.name, i), {})} for i in range(n.devices)]
            if n.up:
                total += n.devices
                held = [d for d in devs if "tier" in d]
                used += len(held)
                working += sum(1 for d in held if d["state"] in WORKING)
            out_nodes.append({"name": n.name, "region": n.region, "cluster": n.cluster, "up": n.up,
                              "lease_left_s": round(max(0.0, n.lease_until - at), 1) if n.up else 0.0,
                              "devices": devs})
        pending = dict(s.execute(select(JobRow.tier, func.count()).where(
            JobRow.state == JobState.PENDING.value).group_by(JobRow.tier)).all())
        groups = tally.by_tier(tally.sla_jobs(s, at))
        sla = {}
        for t in metrics.TIERS:
            items = groups.get(t, [])
            sla[t] = {"attainment": weighted_attainment((j.ranks, j.ideal, j.real) for j in items) if items else None,
                      "target": Tier(t).target, "jobs": len(items)}
        queueing: dict[str, dict[str, float]] = {}
        preemptions: dict[str, float] = {}
        for r in tally.series(s):
            lab = _labels(r.labels)
            if r.name == "tidal_job_queueing_seconds":
                n_, total_s = sum(float(b) for b in (r.data.get("b") or [])), float(r.data.get("s", 0.0))
                queueing[lab.get("tier", "")] = {"started": n_, "mean_s": total_s / n_ if n_ else 0.0}
            elif r.name == "tidal_preemptions_total":
                cause = lab.get("cause", "")
                preemptions[cause] = preemptions.get(cause, 0.0) + float(r.data.get("v", 0.0))
        return {"time": at, "nodes": out_nodes, "devices": total, "used": used, "working": working,
                "utilisation": used / total if total else 0.0, "goodput": working / total if total else 0.0,
                "pending": {t: int(pending.get(t, 0)) for t in metrics.TIERS}, "sla": sla, "queueing": queueing,
                "preemptions": preemptions}


def _labels(text: str) -> dict[str, str]:
    try:
        got = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}
