"""Metrics of one simulated run, per policy and per tier (Singularity's SLA attainment)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from tidal.core import Tier
from tidal.sim.engine import SimJob, SimResult


def percentile(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def job_attainment(j: SimJob) -> float:
    """T_ideal / T_real: run time at full size on dedicated devices over submission-to-completion."""
    assert j.finish is not None
    jct = j.finish - j.submit
    return 1.0 if jct <= 0 else min(1.0, j.duration / jct) if j.duration > 0 else 1.0


def weighted_attainment(jobs: Iterable[tuple[float, float, float]]) -> float:
    """Singularity's tier attainment over ``(W, T_ideal, T_real)`` of each job: GPU-time weighted,
    Σ W·T_ideal / Σ W·T_real (1 where there is no time to weigh). The live control plane exports it too."""
    ideal = real = 0.0
    for w, t_ideal, t_real in jobs:
        ideal += w * t_ideal
        real += w * t_real
    return ideal / real if real > 0 else 1.0


def tier_attainment(jobs: Sequence[SimJob]) -> float:
    """Singularity's tier attainment: GPU-time weighted, Σ W·T_ideal / Σ W·T_real (finished jobs)."""
    return weighted_attainment((j.W, j.duration, float(j.finish or 0.0) - j.submit) for j in jobs)


def summarize(r: SimResult) -> dict[str, Any]:
    jobs = [j for j in r.jobs if j.finish is not None]
    fin = {j.id: float(j.finish or 0.0) for j in jobs}
    jct = [fin[j.id] - j.submit for j in jobs]
    queue = [j.queue_s for j in jobs]
    w0, w1 = r.window
    window = max(w1 - w0, 1e-9)
    out: dict[str, Any] = {
        "jobs": len(jobs),
        "avg_jct_s": _mean(jct),
        "p50_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": _mean(queue),
        "makespan_s": (max(fin.values()) - w0) if jobs else 0.0,
        "goodput": r.good_device_s / (r.capacity * window),
        "allocation": r.alloc_device_s / (r.capacity * window),
        "lost_device_hours": sum(j.lost_device_s for j in jobs) / 3600.0,
        # Devices with no job while some job waited (for any size), first arrival to last finish: what
        # backfill and shrunk starts are for. The fraction is of all device-hours over that span.
        "idle_waiting_device_hours": r.idle_waiting_device_s / 3600.0,
        "idle_waiting_fraction": r.idle_waiting_device_s / (r.capacity * r.span_s) if r.span_s > 0 else 0.0,
        "preemptions": sum(j.preemptions for j in jobs),
        "migrations": sum(j.migrations for j in jobs),
        "resizes": sum(j.resizes for j in jobs),
        "decisions": r.decisions,
        "actions": r.actions,
        "sim_only_actions": r.sim_only_actions,
        "sla": {},
    }
    for tier in (Tier.PREMIUM, Tier.STANDARD, Tier.BASIC):
        tj = [j for j in jobs if j.tier is tier]
        if not tj:
            continue
        att = [job_attainment(j) for j in tj]
        target = tier.target
        tjct = [fin[j.id] - j.submit for j in tj]
        out["sla"][tier.value] = {
            "jobs": len(tj),
            "attainment": tier_attainment(tj),
            "met_fraction": (sum(1 for a in att if a >= target) / len(att)) if target is not None else None,
            "target": target,
            "avg_queue_s": _mean([j.queue_s for j in tj]),
            "avg_jct_s": _mean(tjct),
            "p50_jct_s": percentile(tjct, 50),
            "p99_jct_s": percentile(tjct, 99),
            "attainment_p10": percentile(att, 10),
            "attainment_p50": percentile(att, 50),
        }
    # Admission: the jobs that asked for a guaranteed tier, and those admitted as basic (over their
    # project's quota). The tiers above count each job at the tier it was admitted at.
    out["admission"] = {}
    for tier in (Tier.PREMIUM, Tier.STANDARD):
        asked = [j for j in jobs if j.requested is tier]
        refused = sum(1 for j in r.jobs if j.refused and j.requested is tier)
        if not asked and not refused:
            continue
        demoted = [j for j in asked if j.tier is not tier]
        deferred = [float(j.deferred_s) for j in asked if j.deferred_s is not None]
        work = sum(j.W * j.duration for j in asked)
        out["admission"][tier.value] = {
            "requested": len(asked) + refused,
            "demoted": len(demoted),
            "refused": refused,  # by SLA admission: never ran
            "deferred": len(deferred),  # by SLA admission: held back until the load let them meet their target
            "mean_deferral_s": _mean(deferred),  # submission to release, over the deferred jobs (in their queueing)
            "demoted_work_fraction": (sum(j.W * j.duration for j in demoted) / work) if work > 0 else 0.0,
            "requested_attainment": tier_attainment(asked),  # over every job that asked
        }
    return out
