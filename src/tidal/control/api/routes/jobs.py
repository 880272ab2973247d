"""Users' jobs: submission, listing, requests (preempt, resume, cancel, migrate, resize), checkpoints and
logs. A user sees only their own jobs (others' are 404); an admin sees everyone's."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response
from sqlalchemy import select

from tidal.control import agents, jobs, projects, requests, submission, userlimits, users
from tidal.control.api import views
from tidal.control.api.auth import Principal, User
from tidal.control.api.context import Context, Ctx
from tidal.control.api.schemas import JobSubmit, MigrateRequest, ResizeRequest, ResumeRequest
from tidal.control.store.models import JobRow
from tidal.core import JobState, limits
from tidal.errors import ValidationError

router = APIRouter(prefix="/v1/jobs")


@router.post("", status_code=201)
async def submit(body: JobSubmit, p: User, ctx: Ctx) -> dict[str, Any]:
    spec = body.to_spec(owner=p.name)
    with ctx.db.tx() as s:
        # Under a project the user belongs to, within their limits and the project's (else refused, nothing kept).
        u = users.get(s, p.name)
        userlimits.admit(s, u, projects.for_submission(s, u, spec.project))
        job, why = submission.submit(s, spec, p.name, f"api:{p.name}", quotas=ctx.quotas, sla=ctx.admit_sla)
        out: dict[str, Any] = {"id": job.id, "state": job.state, "name": job.name, "tier": job.tier}
        if job.state == JobState.HELD.value and why.startswith("deferred: "):  # against the load: deferred
            out["deferred"] = why.removeprefix("deferred: ")
        elif why:  # over its project's quota, or against the load
            out["admitted_as"], out["admission"] = job.tier, why
        return out


@router.get("")
def list_jobs(p: User, ctx: Ctx, all_users: Annotated[bool, Query(alias="all")] = False,
              limit: Annotated[int, Query(ge=1, le=limits.MAX_PAGE)] = 1000) -> list[dict[str, Any]]:
    with ctx.db.read() as s:
        q = select(JobRow).order_by(JobRow.seq.desc()).limit(limit)
        if p.owner_filter is not None or not all_users:
            q = q.where(JobRow.owner == p.name)
        return [views.summary(j) for j in s.scalars(q)]


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
