"""What users may see of the cluster: the event log (their own jobs' events; an admin's: all), the
nodes, and the measured links between regions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from tidal.control import drains, jobs, linkrates
from tidal.control.api import views
from tidal.control.api.auth import AnyToken, User
from tidal.control.api.context import Ctx
from tidal.control.clock import now
from tidal.control.store.models import EventRow, JobRow, NodeRow
from tidal.core import limits

router = APIRouter(prefix="/v1")


@router.get("/events")
def events(p: User, ctx: Ctx, job: str | None = None, after: Annotated[int, Query(ge=0, lt=2**63)] = 0,
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
        out = [views.event(e) for e in s.scalars(q)]
        return out[::-1] if last is not None else out


@router.get("/nodes")
def nodes(p: AnyToken, ctx: Ctx) -> list[dict[str, Any]]:
    """Every node; ``gpus`` lists a GPU node's devices (its GPU, and the jobs on each), null on a CPU node;
    ``drained`` (``lease`` | ``admin``), ``drain_reason``, ``drained_at`` and ``undrain_at`` say whether it takes
    new jobs, and why not (:func:`tidal.control.drains.listing`)."""
    with ctx.db.read() as s:
        free = jobs.free_devices(s)
        at = now(s)
        rows = list(s.scalars(select(NodeRow).order_by(NodeRow.name)))
        on = jobs.jobs_on_devices(s) if any(n.gpus for n in rows) else {}
        return [{"name": n.name, "region": n.region, "cluster": n.cluster, "devices": n.devices,
                 "free": len(free.get(n.name, [])) if n.up else 0, "up": n.up, "cpus": n.cpus,
                 "address": n.advertise_addr,
                 "lease_left_s": round(max(0.0, n.lease_until - at), 1),
                 "gpus": views.node_gpus(n.gpus, n.name, on) if n.gpus else None,
                 **drains.listing(s, n)}
                for n in rows]


@router.get("/links")
def links(p: AnyToken, ctx: Ctx) -> list[dict[str, Any]]:
    """The links between regions whose rate was measured from the checkpoints copied over them (the scheduler
    counts on the others at TIDAL_REGION_GBPS, or its default)."""
    with ctx.db.read() as s:
        return linkrates.listing(s)
