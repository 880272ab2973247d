"""Admission against the load: a guaranteed job whose SLA cannot be met now is told so at submission.

The estimate: a guaranteed job starts at once while the unfinished guaranteed jobs admitted at its tier
and above fit in the cluster together with it (they may take devices from lower tiers); beyond that it
waits for their work (device-seconds asked, W × run time) spread over the cluster's devices. Its
attainment is then ``duration / (wait + duration)``. When that is below the tier's target, by configuration the job is
- ``demote``: accepted at the highest lower tier whose estimate meets that tier's target (basic at worst:
  best effort, nothing promised), the reason saying so; or
- ``refuse``: refused, the reason giving the estimate; nothing of it is kept.
``off`` admits every job as asked. The rule needs the job's run time: without one (live jobs give none)
the job is admitted as asked.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tidal.core import Tier
from tidal.errors import ValidationError

SlaMode = Literal["off", "demote", "refuse"]
MODES: tuple[str, ...] = ("off", "demote", "refuse")


def estimate(duration_s: float, backlog_device_s: float, capacity: int) -> float:
    """Expected attainment of a job of ``duration_s`` behind ``backlog_device_s`` on ``capacity`` devices."""
    if duration_s <= 0:
        return 1.0
    wait = backlog_device_s / max(capacity, 1)
    return duration_s / (wait + duration_s)


@dataclasses.dataclass(frozen=True)
class SlaDecision:
    outcome: Literal["accepted", "demoted", "refused"]
    tier: Tier  # the tier it runs at (the asked one when refused)
    estimate: float  # the expected attainment at the tier asked
    reason: str = ""


def decide_sla(mode: SlaMode, tier: Tier, duration_s: float | None, backlog: dict[Tier, float],
               capacity: int, demand: dict[Tier, int] | None = None, devices: int = 1) -> SlaDecision:
    """``backlog``: device-seconds of unfinished admitted work per tier; ``demand``: the devices those jobs
    ask for (None: count the backlog whatever it asks); ``devices``: the job's."""
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
    if est >= target:
        return SlaDecision("accepted", tier, est)
    why = f"expected attainment {est:.2f} at {tier.value} under the current load, below its target {target:.2f}"
    if mode == "refuse":
        return SlaDecision("refused", tier, est, f"refused: {why}; submit later or at a lower tier")
    for lower in (Tier.STANDARD, Tier.BASIC):
        if lower.rank >= tier.rank:
            continue
        t = lower.target
        if t is None or at(lower) >= t:
            return SlaDecision("demoted", lower, est, f"accepted as {lower.value}: {why}")
    return SlaDecision("demoted", Tier.BASIC, est, f"accepted as basic: {why}")  # not reached: basic has no target


class SlaAdmission:
    """Admits jobs in submission order against the guaranteed backlog; told when each job finishes."""

    def __init__(self, mode: SlaMode, capacity: int) -> None:
        self.mode = mode
        self.capacity = capacity
        self.backlog: dict[Tier, float] = {Tier.PREMIUM: 0.0, Tier.STANDARD: 0.0, Tier.BASIC: 0.0}
        self.demand: dict[Tier, int] = {Tier.PREMIUM: 0, Tier.STANDARD: 0, Tier.BASIC: 0}
        self._held: dict[str, tuple[Tier, float, int]] = {}

    def admit(self, job_id: str, tier: Tier, devices: int, duration_s: float | None) -> SlaDecision:
        d = decide_sla(self.mode, tier, duration_s, self.backlog, self.capacity, self.demand, devices)
        if d.outcome != "refused" and duration_s is not None:
            self.backlog[d.tier] += devices * duration_s
            self.demand[d.tier] += devices
            self._held[job_id] = (d.tier, devices * duration_s, devices)
        return d

    def finished(self, job_id: str) -> None:
        held = self._held.pop(job_id, None)
        if held is not None:
            self.backlog[held[0]] -= held[1]
            self.demand[held[0]] -= held[2]
