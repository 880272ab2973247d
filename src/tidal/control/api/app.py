"""The control plane's HTTP API. Users (and admins) manage jobs under /v1/jobs; agents talk to
/v1/agent/*. Every route authenticates with a bearer token; errors are JSON with a message (and the
offending ``field`` for bad input), never a traceback."""

from __future__ import annotations

import pwd
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException

from tidal.control import agents, jobs, tokens
from tidal.control.api.bodylimit import BodyLimit
from tidal.control.api.schemas import (
    ActionResult,
    AgentHello,
    ExitReport,
    Heartbeat,
    JobSubmit,
    MigrateRequest,
    Register,
    ResizeRequest,
    ResumeRequest,
    UserCreate,
)
from tidal.control.store.db import Database
from tidal.control.store.models import EventRow, JobRow, NodeRow
from tidal.core import TERMINAL, JobState, limits
from tidal.errors import Forbidden, TidalError, Unauthorized, ValidationError
from tidal.policy.admission import Quotas


@dataclass
class Context:
    db: Database
    home: Path
    keep: int = 3
    lease_s: float = 5.0
    quotas: Quotas | None = None  # premium and standard are admitted against these


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def owner_filter(self) -> str | None:
        """Whose jobs this principal may see: None for an admin (everyone's)."""
        return None if self.role == "admin" else self.name


async def principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("missing API token", hint="send 'Authorization: Bearer TOKEN'")
    token = authorization.removeprefix("Bearer ").strip()
    key = tokens.digest(token)
    cache: dict[str, Principal] = request.app.state.principals
    p = cache.get(key)
    if p is None:
        ctx: Context = request.app.state.ctx
        with ctx.db.read() as s:
            u = tokens.lookup(s, token)
            if u is None:
                raise Unauthorized("invalid API token")
            p = cache[key] = Principal(u.name, u.role)
    return p


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


def _for_node(p: Principal, node: str) -> None:
    """The cluster's agent credential acts for any node; any other agent credential is one node's own
    (its user name is the node's name) and acts for that node only."""
    if p.name not in (tokens.CLUSTER_AGENT, node):
        raise Forbidden(f"this credential is node {p.name}'s: it cannot act for node {node}", field="node",
                        hint="use the node's own token, or the cluster token")


AnyToken = Annotated[Principal, Depends(principal)]
User = Annotated[Principal, Depends(_user)]
Admin = Annotated[Principal, Depends(_admin)]
Agent = Annotated[Principal, Depends(_agent)]


def create_app(ctx: Context) -> FastAPI:
    app = FastAPI(title="Tidal control plane", version="1")
    app.state.ctx = ctx
    app.state.principals = {}
    # Log chunks from agents are larger than anything else a client sends.
    app.add_middleware(BodyLimit, limit=limits.MAX_BODY_BYTES,
                       routes=(("PUT", r"/v1/agent/[^/]+/logs/[^/]+/[^/]+", limits.MAX_LOG_UPLOAD_BYTES),))

    @app.exception_handler(TidalError)
    async def _tidal_error(_: Request, exc: TidalError) -> JSONResponse:
        return _error(exc.to_dict(), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or None
        msg = f"{field}: {err.get('msg')}" if field else str(err.get("msg"))
        return _error({"error": "ValidationError", "message": msg, "hint": None, "field": field}, 422)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # Unknown routes, wrong methods, bodies that are not JSON text: the same error shape as the rest.
        return _error({"error": "HTTPError", "message": str(exc.detail), "hint": None}, exc.status_code,
                      exc.headers)

    # -- service ------------------------------------------------------------------------------------------
    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "time": time.time()}

    @app.get("/v1/whoami")
    def whoami(p: AnyToken) -> dict[str, str]:
        return {"name": p.name, "role": p.role}

    @app.post("/v1/users", status_code=201)
    def create_user(body: UserCreate, p: Admin) -> dict[str, str]:
        if body.unix_user is not None:
            try:
                pwd.getpwnam(body.unix_user)
            except KeyError:
                raise ValidationError(f"no Unix account {body.unix_user!r}", field="unix_user") from None
        with ctx.db.tx() as s:
            token = tokens.create_user(s, body.name, body.role, body.unix_user)
        return {"name": body.name, "role": body.role, "token": token}

    # -- jobs ------------------------------------------------------------------------------------------------
    @app.post("/v1/jobs", status_code=201)
    async def submit(body: JobSubmit, p: User) -> dict[str, Any]:
        spec = body.to_spec(owner=p.name)
        with ctx.db.tx() as s:
            job, why = jobs.submit(s, spec, p.name, f"api:{p.name}", quotas=ctx.quotas)
            out: dict[str, Any] = {"id": job.id, "state": job.state, "name": job.name, "tier": job.tier}
            if why:  # over its project's quota
                out["admitted_as"], out["admission"] = job.tier, why
            return out

    @app.get("/v1/jobs")
    def list_jobs(p: User, all_users: Annotated[bool, Query(alias="all")] = False,
                  limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE)] = 1000) -> list[dict[str, Any]]:
        with ctx.db.read() as s:
            q = select(JobRow).order_by(JobRow.seq.desc()).limit(limit)
            if p.owner_filter is not None or not all_users:
                q = q.where(JobRow.owner == p.name)
            return [_summary(j) for j in s.scalars(q)]

    @app.get("/v1/jobs/{job_id}")
    def show(job_id: str, p: User) -> dict[str, Any]:
        with ctx.db.read() as s:
            return _detail(s, jobs.get(s, job_id, owner=p.owner_filter))

    def _op(job_id: str, p: Principal, what: str, **kw: Any) -> dict[str, Any]:
        with ctx.db.tx() as s:
            job = jobs.get(s, job_id, owner=p.owner_filter)
            cause = f"api:{p.name}:{what}"
            extra: dict[str, Any] = {}
            if what == "preempt":
                jobs.preempt(s, job, cause, ctx.keep)
            elif what == "resume":
                jobs.resume(s, job, cause, kw.get("from_"))
                extra["resume_from"] = job.resume_from
            elif what == "cancel":
                jobs.cancel(s, job, cause)
            elif what == "resize":
                extra.update(jobs.resize(s, job, kw.get("devices"), cause, ctx.keep))
            elif what == "migrate":
                extra["to"] = jobs.migrate(s, job, kw.get("to"), cause, ctx.keep, rank=kw.get("rank"))
            return {"id": job.id, "state": job.state, "held": job.held, **extra}

    @app.post("/v1/jobs/{job_id}/preempt")
    def preempt(job_id: str, p: User) -> dict[str, Any]:
        return _op(job_id, p, "preempt")

    @app.post("/v1/jobs/{job_id}/resume")
    def resume(job_id: str, p: User, body: ResumeRequest | None = None) -> dict[str, Any]:
        return _op(job_id, p, "resume", from_=body.from_ if body else None)

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, p: User) -> dict[str, Any]:
        return _op(job_id, p, "cancel")

    @app.post("/v1/jobs/{job_id}/migrate")
    def migrate(job_id: str, p: User, body: MigrateRequest | None = None) -> dict[str, Any]:
        return _op(job_id, p, "migrate", to=body.to if body else None, rank=body.rank if body else None)

    @app.post("/v1/jobs/{job_id}/resize")
    def resize(job_id: str, body: ResizeRequest, p: User) -> dict[str, Any]:
        return _op(job_id, p, "resize", devices=body.devices)

    @app.get("/v1/jobs/{job_id}/checkpoints")
    def list_checkpoints(job_id: str, p: User) -> list[dict[str, Any]]:
        with ctx.db.read() as s:
            job = jobs.get(s, job_id, owner=p.owner_filter)
            return [_ckpt(c) for c in jobs.checkpoints(s, job.id)]

    @app.get("/v1/jobs/{job_id}/logs")
    def logs(job_id: str, p: User, rank: Annotated[int, Query(ge=0)] = 0,
             offset: Annotated[int, Query(ge=0, le=limits.MAX_LOG_OFFSET)] = 0) -> Response:
        """At most MAX_LOG_READ_BYTES from ``offset``; X-Tidal-Log-Size says how much there is."""
        with ctx.db.read() as s:
            job = jobs.get(s, job_id, owner=p.owner_filter)
            st, ranks = job.state, job.ranks
        if rank >= ranks:
            raise ValidationError(f"rank: job {job_id} has ranks 0..{ranks - 1}, not {rank}", field="rank")
        path = agents.log_path(ctx.home, job_id, rank)
        data = b""
        size = 0
        if path.exists():
            with path.open("rb") as f:
                size = f.seek(0, 2)
                if offset < size:
                    f.seek(offset)
                    data = f.read(min(size - offset, limits.MAX_LOG_READ_BYTES))
        return Response(data, media_type="application/octet-stream",
                        headers={"X-Tidal-Log-Size": str(size), "X-Tidal-Job-State": st})

    @app.get("/v1/events")
    def events(p: User, job: str | None = None, after: Annotated[int, Query(ge=0, lt=2**63)] = 0,
               limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE)] = 1000,
               last: Annotated[int | None, Query(ge=1, le=limits.MAX_PAGE)] = None) -> list[dict[str, Any]]:
        """Events after ``after`` (oldest first, at most ``limit``), or the ``last`` N."""
        with ctx.db.read() as s:
            if last is not None:
                q = select(EventRow).order_by(EventRow.seq.desc()).limit(last)
            else:
                q = select(EventRow).where(EventRow.seq > after).order_by(EventRow.seq).limit(limit)
            if job is not None:
                jobs.get(s, job, owner=p.owner_filter)
                q = q.where(EventRow.job_id == job)
            elif p.owner_filter is not None:
                mine = select(JobRow.id).where(JobRow.owner == p.name)
                q = q.where(EventRow.job_id.in_(mine))
            out = [_event(e) for e in s.scalars(q)]
            return out[::-1] if last is not None else out

    @app.get("/v1/nodes")
    def nodes(p: AnyToken) -> list[dict[str, Any]]:
        with ctx.db.read() as s:
            free = jobs.free_devices(s)
            return [{"name": n.name, "region": n.region, "cluster": n.cluster, "devices": n.devices,
                     "free": len(free.get(n.name, [])) if n.up else 0, "up": n.up, "cpus": n.cpus,
                     "lease_left_s": round(max(0.0, n.lease_until - time.time()), 1)}
                    for n in s.scalars(select(NodeRow).order_by(NodeRow.name))]

    # -- agents ---------------------------------------------------------------------------------------------
    @app.post("/v1/agent/register")
    def register(body: Register, p: Agent) -> dict[str, Any]:
        _for_node(p, body.name)
        with ctx.db.tx() as s:
            agents.register(s, name=body.name, region=body.region, cluster=body.cluster, devices=body.devices,
                            cpus=body.cpus, agent_id=body.agent_id, lease_s=ctx.lease_s)
        return {"lease_s": ctx.lease_s}

    @app.post("/v1/agent/{node}/heartbeat")
    def heartbeat(node: str, body: Heartbeat, p: Agent) -> dict[str, Any]:
        _for_node(p, node)
        with ctx.db.tx(notify=False) as s:
            agents.heartbeat(s, node, body.agent_id, ctx.lease_s, body.jobs)
        return {"lease_s": ctx.lease_s}

    @app.get("/v1/agent/{node}/actions")
    def take_actions(node: str, agent_id: str, p: Agent,
                     wait: Annotated[float, Query(ge=0, le=limits.MAX_POLL_WAIT_S)] = 0.0) -> list[dict[str, Any]]:
        _for_node(p, node)
        deadline = time.monotonic() + wait
        with ctx.db.changed:
            while True:
                seen = ctx.db.action_generation
                with ctx.db.read() as s:
                    ready = agents.has_actions(s, node)
                if ready:
                    break
                # Sleep until some commit creates actions (not on every commit: submissions are many).
                def acted(seen: int = seen) -> bool:
                    return ctx.db.action_generation != seen

                if not ctx.db.changed.wait_for(acted, timeout=max(0.0, deadline - time.monotonic())):
                    break
            with ctx.db.tx(notify=False) as s:
                return agents.take_actions(s, node, agent_id)

    @app.post("/v1/agent/{node}/leave")
    def leave(node: str, body: AgentHello, p: Agent) -> dict[str, Any]:
        _for_node(p, node)
        with ctx.db.tx() as s:
            agents.expire(s, agents.holder(s, node, body.agent_id), "its agent stopped")
        return {"ok": True}

    @app.post("/v1/agent/{node}/results")
    def action_result(node: str, body: ActionResult, p: Agent) -> dict[str, Any]:
        _for_node(p, node)
        with ctx.db.tx() as s:
            applied = agents.result(s, node, body.agent_id, body.action_id, body.ok, body.data, body.error,
                                    ctx.keep)
        return {"applied": applied}

    @app.post("/v1/agent/{node}/exits")
    def exits(node: str, body: ExitReport, p: Agent) -> dict[str, Any]:
        _for_node(p, node)
        with ctx.db.tx() as s:
            applied = agents.exited(s, node, body.agent_id, body.job_id, body.attempt,
                                    [r.model_dump() for r in body.ranks], ctx.keep)
        return {"applied": applied}

    @app.put("/v1/agent/{node}/logs/{job_id}/{rank}")
    async def upload_log(node: str, job_id: str, rank: Annotated[int, PathParam(ge=0, lt=limits.MAX_RANKS)],
                         agent_id: str, attempt: int, offset: Annotated[int, Query(ge=0, le=limits.MAX_LOG_OFFSET)],
                         request: Request, p: Agent) -> dict[str, Any]:
        _for_node(p, node)
        data = await request.body()  # at most MAX_LOG_UPLOAD_BYTES (BodyLimit)
        with ctx.db.tx(notify=False) as s:
            applied = agents.write_log(s, ctx.home, node, agent_id, job_id, attempt, rank, offset, data)
        return {"applied": applied}

    return app


def _summary(j: JobRow) -> dict[str, Any]:
    return {"id": j.id, "name": j.name, "owner": j.owner, "tier": j.tier, "ranks": j.ranks, "state": j.state,
            "held": j.held, "submitted_at": j.submitted_at, "exit_code": j.exit_code, "restarts": j.restarts,
            "nodes": sorted({p["node"] for p in j.placement})}


def _ckpt(c: Any) -> dict[str, Any]:
    return {"id": c.id, "created_at": c.created_at, "bytes": c.bytes, "stored_bytes": c.stored_bytes,
            "parts": list(c.parts or [c.id]), "state": c.state.value}


def _event(e: EventRow) -> dict[str, Any]:
    return {"seq": e.seq, "id": e.id, "time": e.time, "kind": e.kind, "job": e.job_id, "node": e.node,
            "cause": e.cause, "detail": e.detail}


def _detail(s: Session, j: JobRow) -> dict[str, Any]:
    # The latest events only: a long-lived job with frequent checkpoints has many.
    evs = s.scalars(select(EventRow).where(EventRow.job_id == j.id).order_by(EventRow.seq.desc())
                    .limit(limits.MAX_JOB_EVENTS_SHOWN))
    return {
        **_summary(j),
        "command": j.spec["command"], "workdir": j.spec["workdir"],
        "checkpoint_every": j.spec.get("checkpoint_every"), "max_restarts": j.spec.get("max_restarts"),
        "started_at": j.started_at, "finished_at": j.finished_at, "error": j.error, "attempt": j.attempt,
        "terminal": JobState(j.state) in TERMINAL,
        "busy": j.op is not None,
        "progress": j.progress,
        "exited": j.exited or {},
        "devices": len({(p["node"], p["device"]) for p in j.placement}),
        "min_devices": j.spec.get("min_devices") or 1, "max_devices": j.spec.get("max_devices") or j.ranks,
        "pinned_devices": j.pinned_devices,
        "resume_from": j.resume_from,
        "placement": [{"rank": p["rank"], "node": p["node"], "device": p["device"], "pid": p["pid"]}
                      for p in j.placement],
        "checkpoints": [_ckpt(c) for c in jobs.checkpoints(s, j.id)],
        "events": [_event(e) for e in evs][::-1],
    }


def _error(body: dict[str, Any], status: int, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error as JSON. Its text may quote the request (a field's name, a value): a lone surrogate there
    has no UTF-8 form, so it is shown escaped instead of failing the answer."""
    return JSONResponse(_escaped(body), status_code=status, headers=headers)


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value
