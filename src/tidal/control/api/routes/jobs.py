"""Users' jobs: submission, listing (filtered, paged), requests (preempt, resume, cancel, migrate, resize; cancel
and preempt of several jobs at once), checkpoints and logs. A user sees only their own jobs (others' are 404);
an admin sees everyone's."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from tidal.control import agents, bulk, intake, jobfilter, jobs, requests
from tidal.control.api import views
from tidal.control.api.auth import Principal, User
from tidal.control.api.context import Context, Ctx
from tidal.control.api.lanes import INTAKE, in_batch
from tidal.control.api.schemas import BulkRequest, JobSubmit, MigrateRequest, ResizeRequest, ResumeRequest
from tidal.core import limits
from tidal.errors import ValidationError

router = APIRouter(prefix="/v1/jobs")


@router.post("", status_code=201)
async def submit(body: JobSubmit, request: Request, p: User, ctx: Ctx) -> dict[str, Any]:
    spec = body.to_spec(owner=p.name)
    work = functools.partial(intake.answer, spec=spec, owner=p.name, cause=f"api:{p.name}", quotas=ctx.quotas,
                             sla=ctx.admit_sla)
    return await in_batch(request, INTAKE, work, db=ctx.db)


def _selection(p: Principal, *, all_users: bool, state: list[str] | None, user: list[str] | None,
               name: str | None, tier: list[str] | None, since: float | None,
               unfinished: bool = False) -> tuple[jobfilter.Filter, str]:
    """The filter a listing's query (or a bulk request's ``filter``) gives, and its scope (own, users, all);
    ``unfinished``: where no state is named, the jobs not yet ended."""
    owners, scope = jobfilter.owners(p.name, p.role == "admin", jobfilter.values(user, "user"), all_users)
    states = jobfilter.states(jobfilter.values(state, "state"))
    if states is None and unfinished:
        states = jobfilter.UNFINISHED
    f = jobfilter.Filter(owners=owners, states=states, name=jobfilter.name_pattern(name),
                         tiers=jobfilter.tiers(jobfilter.values(tier, "tier")), since=since)
    return f, scope


@router.get("")
def list_jobs(p: User, ctx: Ctx, response: Response,
              all_users: Annotated[bool, Query(alias="all")] = False,
              state: Annotated[list[str] | None, Query()] = None,
              user: Annotated[list[str] | None, Query()] = None,
              name: str | None = None,
              tier: Annotated[list[str] | None, Query()] = None,
              since: Annotated[float | None, Query(allow_inf_nan=False)] = None,
              cursor: str | None = None,
              limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE)] = 1000) -> list[dict[str, Any]]:
    """Jobs, newest first: a page of at most ``limit``. The headers say how many the filter selects in all
    (``X-Tidal-Total-Count``), where the next page starts (``X-Tidal-Next-Cursor``: absent on the last page; give
    it as ``cursor``), and whose jobs these are (``X-Tidal-Scope``: ``own``, ``users`` or ``all``; a caller who is
    not an admin gets ``own`` for ``all=true``)."""
    f, scope = _selection(p, all_users=all_users, state=state, user=user, name=name, tier=tier, since=since)
    with ctx.db.read() as s:
        pg = jobfilter.page(s, f, cursor, limit)
        total = jobfilter.count(s, f)
        out = [views.summary(j) for j in pg.jobs]
    response.headers["X-Tidal-Total-Count"] = str(total)
    response.headers["X-Tidal-Scope"] = scope
    if pg.next_cursor is not None:
        response.headers["X-Tidal-Next-Cursor"] = pg.next_cursor
    return out


def _bulk(ctx: Context, p: Principal, verb: bulk.Verb, body: BulkRequest) -> dict[str, Any]:
    if (body.ids is None) == (body.filter is None):
        raise ValidationError("give the jobs' ids or a filter, one of the two", field="ids",
                              hint='{"ids": ["ID", ...]} or {"filter": {"state": [...], "user": [...], ...}}')
    cause = f"api:{p.name}:{verb}"
    if body.ids is not None:
        if not body.ids:
            raise ValidationError("ids: give at least one job id", field="ids")
        if body.cursor is not None:
            raise ValidationError("cursor: a cursor goes with a filter, not with ids", field="cursor")
        results = bulk.act(ctx.db, verb, body.ids, None if p.role == "admin" else (p.name,), cause)
        return {"results": results, "counts": bulk.counts(results), "next_cursor": None}
    q = body.filter
    assert q is not None
    f, _ = _selection(p, all_users=q.all, state=q.state, user=q.user, name=q.name, tier=q.tier, since=q.since,
                      unfinished=True)
    with ctx.db.read() as s:
        pg = jobfilter.page(s, f, body.cursor, jobfilter.MAX_BULK)
        ids = [j.id for j in pg.jobs]
    # What the filter selected, but acted on only if still the caller's to act on.
    results = bulk.act(ctx.db, verb, ids, f.owners, cause)
    return {"results": results, "counts": bulk.counts(results), "next_cursor": pg.next_cursor}


@router.post("/cancel")
def cancel_many(body: BulkRequest, p: User, ctx: Ctx) -> dict[str, Any]:
    """Cancel several jobs: ``{"ids": [...]}`` (at most MAX_BULK), or ``{"filter": {...}}`` (a page of at most
    MAX_BULK of the jobs it selects; ``next_cursor``, given back as ``cursor``, where more are left). Each job's
    outcome in ``results``, in order (:mod:`tidal.control.bulk`)."""
    return _bulk(ctx, p, "cancel", body)


@router.post("/preempt")
def preempt_many(body: BulkRequest, p: User, ctx: Ctx) -> dict[str, Any]:
    """Preempt several jobs (each held until resumed), as ``POST /v1/jobs/cancel`` selects them."""
    return _bulk(ctx, p, "preempt", body)


@router.get("/{job_id}")
def show(job_id: str, p: User, ctx: Ctx) -> dict[str, Any]:
    with ctx.db.read() as s:
        return views.detail(s, jobs.get(s, job_id, owner=p.owner_filter))


def _op(ctx: Context, job_id: str, p: Principal, what: str, **kw: Any) -> dict[str, Any]:
    with ctx.db.tx() as s:
        job = jobs.get(s, job_id, owner=p.owner_filter)
        cause = f"api:{p.name}:{what}"
        extra: dict[str, Any] = {}
        if what == "preempt":
            requests.preempt(s, job, cause)
        elif what == "resume":
            requests.resume(s, job, cause, kw.get("from_"))
            extra["resume_from"] = job.resume_from
        elif what == "cancel":
            requests.cancel(s, job, cause)
        elif what == "resize":
            extra.update(requests.resize(s, job, kw.get("devices"), cause))
        elif what == "migrate":
            extra["to"] = requests.migrate(s, job, kw.get("to"), cause, rank=kw.get("rank"),
                                           region=kw.get("region"), cluster=kw.get("cluster"))
        return {"id": job.id, "state": job.state, "held": job.held, **extra}


@router.post("/{job_id}/preempt")
def preempt(job_id: str, p: User, ctx: Ctx) -> dict[str, Any]:
    return _op(ctx, job_id, p, "preempt")


@router.post("/{job_id}/resume")
def resume(job_id: str, p: User, ctx: Ctx, body: ResumeRequest | None = None) -> dict[str, Any]:
    return _op(ctx, job_id, p, "resume", from_=body.from_ if body else None)


@router.post("/{job_id}/cancel")
def cancel(job_id: str, p: User, ctx: Ctx) -> dict[str, Any]:
    return _op(ctx, job_id, p, "cancel")


@router.post("/{job_id}/migrate")
def migrate(job_id: str, p: User, ctx: Ctx, body: MigrateRequest | None = None) -> dict[str, Any]:
    body = body or MigrateRequest()
    return _op(ctx, job_id, p, "migrate", to=body.to, rank=body.rank, region=body.region, cluster=body.cluster)


@router.post("/{job_id}/resize")
def resize(job_id: str, body: ResizeRequest, p: User, ctx: Ctx) -> dict[str, Any]:
    return _op(ctx, job_id, p, "resize", devices=body.devices)


@router.get("/{job_id}/checkpoints")
def list_checkpoints(job_id: str, p: User, ctx: Ctx) -> list[dict[str, Any]]:
    with ctx.db.read() as s:
        job = jobs.get(s, job_id, owner=p.owner_filter)
        return [views.checkpoint(c) for c in jobs.checkpoints(s, job.id)]


@router.get("/{job_id}/logs")
def logs(job_id: str, p: User, ctx: Ctx, rank: Annotated[int, Query(ge=0)] = 0,
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
