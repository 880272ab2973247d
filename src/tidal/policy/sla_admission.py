"""Admission against the load: a guaranteed job whose SLA cannot be met now is told so at submission.

The estimate: a guaranteed job starts at once while the unfinished guaranteed jobs admitted at its tier
and above fit in the cluster together with it (they may take devices from lower tiers); beyond that it
waits for their work (device-seconds asked, W × run time) spread over the cluster's devices. Its
attainment is then ``duration / (wait + duration)``. When that is below the tier's target, by configuration the job is
- ``demote``: accepted at the highest lower tier whose estimate meets that tier's target (basic at worst:
  best effort, nothing promised), the reason saying so; or
- ``refuse``: refused, the reason giving the estimate; nothing of it is kept; or
- ``defer``: accepted at its tier but deferred: it is not scheduled until the estimate, recomputed as
  admitted work finishes (:func:`release`), meets the target; then it joins the queue at its tier. Deferred
  jobs are released in submission order: a job never overtakes an earlier deferred one of its tier (a new
  job of a tier that has deferred jobs waiting is deferred behind them, whatever its estimate).
  A deferred job's own work is not in the backlog while it waits, and it is added when the job is released:
  until then it holds no device and delays no one (a guaranteed job admitted meanwhile starts ahead of it,
  as it would have had the deferred job been submitted later), and counting it would make its own estimate
  wait behind itself.
``off`` admits every job as asked. The rule needs the job's run time: without one (a live job submitted
without ``--runtime``) the job is admitted as asked. The backlog is what is left of the admitted jobs' run
times: live, each job's given run time less the device-seconds it has run over its devices; in the
simulator, its work left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

from tidal.core import Tier
from tidal.errors import ValidationError

SlaMode = Literal["off", "demote", "refuse", "defer"]
MODES: tuple[str, ...] = ("off", "demote", "refuse", "defer")


def estimate(duration_s: float, backlog_device_s: float, capacity: int) -> float:
    """Expected attainment of a job of ``duration_s`` behind ``backlog_device_s`` on ``capacity`` devices."""
    if duration_s <= 0:
        return 1.0
    wait = backlog_device_s / max(capacity, 1)
    return duration_s / (wait + duration_s)


def run_time_left(runtime: float | None, attained_device_s: float, ranks: int) -> float | None:
    """What is left of the run time a job gave (``tidal submit --runtime``: at its full size), after the
    device-seconds it has run; None when it gave none. A run on D < W devices counts D/W of its time (the
    policy's ceil(W/D) ranks a device, where D divides W)."""
    if runtime is None:
        return None
    return max(0.0, runtime - attained_device_s / max(ranks, 1))


@dataclasses.dataclass(frozen=True)
class SlaDecision:
    outcome: Literal["accepted", "demoted", "refused", "deferred"]
    tier: Tier  # the tier it runs at (the asked one when refused)
    estimate: float  # the expected attainment at the tier asked
    reason: str = ""


def decide_sla(mode: SlaMode, tier: Tier, duration_s: float | None, backlog: dict[Tier, float],
               capacity: int, demand: dict[Tier, int] | None = None, devices: int = 1,
               deferred_ahead: int = 0) -> SlaDecision:
    """``backlog``: device-seconds of unfinished admitted work per tier; ``demand``: the devices those jobs
    ask for (None: count the backlog whatever it asks); ``devices``: the job's; ``deferred_ahead``: (mode
    ``defer``) the deferred jobs of its tier still waiting, submitted before it: it is deferred behind them."""
    if mode not in MODES:
        raise ValidationError(f"unknown SLA admission {mode!r}", field="admit_sla", hint="one of: " + ", ".join(MODES))
    target = tier.target
    if mode == "off" or target is None or duration_s is None:
        return SlaDecision("accepted", tier, 1.0)

    def at(t: Tier) -> float:
        if demand is not None and sum(v for k, v in demand.items() if k.rank >= t.rank) + devices <= capacity:
            return 1.0
        return estimate(duration_s, sum(v for k, v in backlog.items() if k.rank >= t.rank), capacity)

    est = at(tier)
    if mode == "defer" and deferred_ahead > 0:
        return SlaDecision("deferred", tier, est,
                           f"deferred: behind {deferred_ahead} earlier deferred {tier.value} job(s) (expected "
                           f"attainment {est:.2f} at {tier.value}, target {target:.2f}); it starts after them, "
                           "when its target is met")
    if est >= target:
        return SlaDecision("accepted", tier, est)
    why = f"expected attainment {est:.2f} at {tier.value} under the current load, below its target {target:.2f}"
    if mode == "refuse":
        return SlaDecision("refused", tier, est, f"refused: {why}; submit later or at a lower tier")
    if mode == "defer":
        return SlaDecision("deferred", tier, est, f"deferred: {why}; it starts when that is met")
    for lower in (Tier.STANDARD, Tier.BASIC):
        if lower.rank >= tier.rank:
            continue
        t = lower.target
        if t is None or at(lower) >= t:
            return SlaDecision("demoted", lower, est, f"accepted as {lower.value}: {why}")
    return SlaDecision("demoted", Tier.BASIC, est, f"accepted as basic: {why}")  # not reached: basic has no target


@dataclasses.dataclass(frozen=True)
class Deferred:
    """A deferred job, as :func:`release` weighs it."""

    job_id: str
    tier: Tier
    duration_s: float
    devices: int


@dataclasses.dataclass(frozen=True)
class Release:
    job_id: str
    estimate: float  # its expected attainment at its tier, now
    reason: str  # "released: expected attainment now 0.74 ≥ 0.70"


def release(waiting: list[Deferred], backlog: dict[Tier, float], capacity: int,
            demand: dict[Tier, int] | None = None) -> list[Release]:
    """The deferred jobs to release now, ``waiting`` in submission order: each whose estimate at its tier
    (:func:`decide_sla`'s rule, against ``backlog`` and ``demand`` plus the work of the jobs released before
    it here) meets its target, up to the first of its tier that does not (none overtakes an earlier one of
    its tier). Pure: the arguments are not changed."""
    backlog = dict(backlog)
    demand = dict(demand) if demand is not None else None
    blocked: set[Tier] = set()
    out: list[Release] = []
    for d in waiting:
        if d.tier in blocked:
            continue
        a = decide_sla("refuse", d.tier, d.duration_s, backlog, capacity, demand, d.devices)
        target = d.tier.target
        if target is not None and a.outcome != "accepted":
            blocked.add(d.tier)
            continue
        out.append(Release(d.job_id, a.estimate,
                           f"released: expected attainment now {a.estimate:.2f} ≥ {target or 0.0:.2f}"))
        backlog[d.tier] = backlog.get(d.tier, 0.0) + d.devices * d.duration_s
        if demand is not None:
            demand[d.tier] = demand.get(d.tier, 0) + d.devices
    return out


class SlaAdmission:
    """Admits jobs in submission order against the guaranteed backlog; told when each job finishes.
    ``done``: the work a job has done so far, seconds at full size (the live control plane's rule: what is
    left of an admitted job's run time is its backlog); None: each job counts its whole run time until it
    finishes."""

    def __init__(self, mode: SlaMode, capacity: int, done: Callable[[str], float] | None = None) -> None:
        self.mode = mode
        self.capacity = capacity
        self.done = done
        self._held: dict[str, tuple[Tier, float, int]] = {}  # admitted, unfinished: tier, run time, devices
        self.deferred: list[Deferred] = []  # in submission order

    @property
    def backlog(self) -> dict[Tier, float]:
        """Device-seconds of admitted work left, per tier."""
        out = dict.fromkeys(Tier, 0.0)
        for jid, (tier, duration, devices) in self._held.items():
            left = duration - self.done(jid) if self.done is not None else duration
            out[tier] += devices * max(0.0, left)
        return out

    @property
    def demand(self) -> dict[Tier, int]:
        """Devices the admitted unfinished jobs ask for, per tier."""
        out = dict.fromkeys(Tier, 0)
        for tier, _, devices in self._held.values():
            out[tier] += devices
        return out

    def admit(self, job_id: str, tier: Tier, devices: int, duration_s: float | None) -> SlaDecision:
        ahead = sum(1 for x in self.deferred if x.tier is tier)
        d = decide_sla(self.mode, tier, duration_s, self.backlog, self.capacity, self.demand, devices, ahead)
        if d.outcome == "deferred" and duration_s is not None:
            self.deferred.append(Deferred(job_id, tier, duration_s, devices))  # counted once released
        elif d.outcome != "refused" and duration_s is not None:
            self._held[job_id] = (d.tier, duration_s, devices)
        return d

    def release(self) -> list[Release]:
        """The deferred jobs whose estimate now meets their target, in submission order; their work joins
        the backlog."""
        if not self.deferred:
            return []
        out = release(self.deferred, self.backlog, self.capacity, self.demand)
        gone = {r.job_id for r in out}
        for x in self.deferred:
            if x.job_id in gone:
                self._held[x.job_id] = (x.tier, x.duration_s, x.devices)
        self.deferred = [x for x in self.deferred if x.job_id not in gone]
        return out

    def finished(self, job_id: str) -> None:
        self._held.pop(job_id, None)
