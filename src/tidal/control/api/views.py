"""Rows of the database as the API shows them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import jobs
from tidal.control.store.models import CheckpointRow, EventRow, JobRow
from tidal.core import TERMINAL, JobSpec, JobState, limits


def summary(j: JobRow) -> dict[str, Any]:
    return {"id": j.id, "name": j.name, "owner": j.owner, "tier": j.tier, "ranks": j.ranks, "state": j.state,
            "held": j.held, "submitted_at": j.submitted_at, "exit_code": j.exit_code, "restarts": j.restarts,
            "nodes": sorted({p["node"] for p in j.placement}),
            # Why it waits (tidal.policy.reasons), while it waits; else null.
            "reason": j.reason, "reason_code": j.reason_code}


def checkpoint(c: CheckpointRow) -> dict[str, Any]:
    return {"id": c.id, "created_at": c.created_at, "bytes": c.bytes, "stored_bytes": c.stored_bytes,
            "parts": list(c.parts or [c.id]), "state": c.state.value, "regions": c.regions}


def event(e: EventRow) -> dict[str, Any]:
    return {"seq": e.seq, "id": e.id, "time": e.time, "kind": e.kind, "job": e.job_id, "node": e.node,
            "cause": e.cause, "detail": e.detail}


def detail(s: Session, j: JobRow) -> dict[str, Any]:
    # The latest events only: a long-lived job with frequent checkpoints has many.
    evs = s.scalars(select(EventRow).where(EventRow.job_id == j.id).order_by(EventRow.seq.desc())
                    .limit(limits.MAX_JOB_EVENTS_SHOWN))
    spec = JobSpec.from_json(j.spec)
    return {
        **summary(j),
        "command": list(spec.command), "workdir": spec.workdir,
        "checkpoint_every": spec.checkpoint_every, "max_restarts": spec.max_restarts,
        "started_at": j.started_at, "finished_at": j.finished_at, "error": j.error, "attempt": j.attempt,
        "terminal": JobState(j.state) in TERMINAL,
        "busy": j.op is not None,
        "progress": j.progress,
        "exited": j.exited or {},
        "devices": len({(p["node"], p["device"]) for p in j.placement}),
        "min_devices": spec.min_devices, "max_devices": spec.max_devices,
        "pinned_devices": j.pinned_devices,
        "resume_from": j.resume_from,
        "placement": [{"rank": p["rank"], "node": p["node"], "device": p["device"], "pid": p["pid"]}
                      for p in j.placement],
        "checkpoints": [checkpoint(c) for c in jobs.checkpoints(s, j.id)],
        "events": [event(e) for e in evs][::-1],
    }


def node_gpus(gpus: list[dict[str, Any]], node: str, on: dict[tuple[str, int], list[str]]) -> list[dict[str, Any]]:
    """A GPU node's devices as the API shows them: device index, its GPU (NVML index, UUID, model, memory in
    bytes) and the jobs whose ranks run on it (``on``: :func:`tidal.control.jobs.jobs_on_devices`)."""
    return [{"device": d, "index": g.get("index"), "uuid": g.get("uuid"), "model": g.get("model"),
             "memory_bytes": g.get("memory_bytes"), "jobs": on.get((node, d), [])}
            for d, g in enumerate(gpus)]
