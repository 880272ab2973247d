"""The cluster as the dashboard shows it: every node (by region and cluster) and device with the tier of the job
on it, and the figures of the moment: utilisation, goodput, SLA attainment and queueing per tier, preemptions
by cause. The same figures as GET /metrics (docs/metrics.md), read the same way."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tidal.control import drains, jobs, metrics, tally
from tidal.control.clock import now
from tidal.control.store.db import Database
from tidal.control.store.models import JobRow, NodeRow
from tidal.core import JobState, Tier
from tidal.sim.metrics import weighted_attainment

#: A device is productive while its job is in these states (not checkpointing, restoring or moving).
WORKING = (JobState.RUNNING.value,)


def overview(db: Database, owner: str | None) -> dict[str, Any]:
    """``owner``: whose jobs are named on their devices (None: everyone's, for an admin); another user's job
    is shown by its tier and state only."""
    metrics.fold(db)  # the counters (preemptions by cause, queueing) are the folded event log's
    with db.read() as s:
        at = now(s)
        out = _devices(s, owner, at)
        out.update(_figures(s, at))
        out["time"] = at
        return out


def _devices(s: Session, owner: str | None, at: float) -> dict[str, Any]:
    on: dict[tuple[str, int], dict[str, Any]] = {}
    for j in s.scalars(select(JobRow).where(JobRow.state.in_([st.value for st in jobs.ACTIVE]))):
        mine = owner is None or j.owner == owner
        for d in jobs.held_devices(j):
            on[(d.node, d.index)] = {"tier": j.tier, "state": j.state, **(
                {"job": j.id, "name": j.name, "owner": j.owner} if mine else {"job": None})}
    total = used = working = 0
    nodes = []
    for n in s.scalars(select(NodeRow).order_by(NodeRow.region, NodeRow.cluster, NodeRow.name)):
        devs = [{"index": i, **on.get((n.name, i), {})} for i in range(n.devices)]
        if n.up:
            held = [d for d in devs if "tier" in d]
            total, used = total + n.devices, used + len(held)
            working += sum(1 for d in held if d["state"] in WORKING)
        nodes.append({"name": n.name, "region": n.region, "cluster": n.cluster, "up": n.up,
                      "lease_left_s": round(max(0.0, n.lease_until - at), 1) if n.up else 0.0, "devices": devs,
                      "drained": drains.describe(s, n)})
    return {"nodes": nodes, "devices": total, "used": used, "working": working,
            "utilisation": used / total if total else 0.0, "goodput": working / total if total else 0.0}


def _figures(s: Session, at: float) -> dict[str, Any]:
    pending = {str(t): int(n) for t, n in s.execute(select(JobRow.tier, func.count()).where(
        JobRow.state == JobState.PENDING.value).group_by(JobRow.tier))}
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
            started, total_s = sum(float(b) for b in (r.data.get("b") or [])), float(r.data.get("s", 0.0))
            queueing[lab.get("tier", "")] = {"started": started, "mean_s": total_s / started if started else 0.0}
        elif r.name == "tidal_preemptions_total":
            cause = lab.get("cause", "")
            preemptions[cause] = preemptions.get(cause, 0.0) + float(r.data.get("v", 0.0))
    return {"pending": {t: pending.get(t, 0) for t in metrics.TIERS}, "sla": sla, "queueing": queueing,
            "preemptions": preemptions}


def _labels(text: str) -> dict[str, str]:
    try:
        got = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}
