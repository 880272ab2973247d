"""Admission of premium and standard jobs against per-project quotas (Kueue's nominal quotas).

A project's quota is a share of the devices. A guaranteed job (premium or standard) is admitted at its
tier when its project's admitted guaranteed jobs that have not finished (running or waiting) plus this
one ask for at most ``share × capacity`` devices. Otherwise it is admitted as basic work, for good: it
still runs wherever devices are idle or basic work yields, but nothing was promised for it. Counting
what admitted jobs *ask for* rather than what they hold is what lets the promise be kept: admitted
guaranteed work never exceeds the quotas, whatever the scheduler does. It needs no run times, so the
live control plane can decide the same way at submission.

Projects without a quota, and basic jobs, are admitted as they come.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from tidal.core import Tier
from tidal.errors import ValidationError

DEFAULT = "*"  # the quota of every project not named


@dataclasses.dataclass(frozen=True)
class Quotas:
    """Per-project shares of the devices (0..1); ``DEFAULT`` ("*") covers projects not named."""

    shares: Mapping[str, float]

    def __post_init__(self) -> None:
        for project, share in self.shares.items():
            if not 0.0 <= share <= 1.0:
                raise ValidationError(f"quota of project {project!r} must be a share between 0 and 1, got {share}",
                                      field="quota", hint="give each project a share of the devices from 0 to 1, "
                                      "e.g. 'vision=0.4'")

    def share(self, project: str) -> float | None:
        s = self.shares.get(project)
        return self.shares.get(DEFAULT) if s is None else s


@dataclasses.dataclass(frozen=True)
class Decision:
    tier: Tier  # the tier the job runs at
    requested: Tier
    reason: str = ""  # why it was demoted; empty when admitted as asked

    @property
    def demoted(self) -> bool:
        return self.tier is not self.requested


def decide(quotas: Quotas, capacity: int, project: str, tier: Tier, devices: int, used: int) -> Decision:
    """The tier a job is admitted at, given the devices its project's admitted, unfinished guaranteed jobs
    ask for (``used``)."""
    if tier is Tier.BASIC:
        return Decision(tier, tier)
    share = quotas.share(project)
    if share is None:
        return Decision(tier, tier)
    limit = int(share * capacity + 1e-9)
    if used + devices > limit:
        return Decision(Tier.BASIC, tier, f"project {project!r} has {used} of its {limit} guaranteed devices "
                                          f"admitted; {devices} more would exceed its quota")
    return Decision(tier, tier)


class Admission:
    """Admits jobs one at a time, in submission order; told when each admitted job finishes."""

    def __init__(self, quotas: Quotas, capacity: int) -> None:
        self.quotas = quotas
        self.capacity = capacity
        self._used: dict[str, int] = {}  # project → devices asked for by its admitted guaranteed jobs
        self._holds: dict[str, tuple[str, int]] = {}  # job → (project, devices) while it counts

    def used(self, project: str) -> int:
        return self._used.get(project, 0)

    def admit(self, job_id: str, project: str, tier: Tier, devices: int) -> Decision:
        used = self._used.get(project, 0)
        d = decide(self.quotas, self.capacity, project, tier, devices, used)
        if d.tier is not Tier.BASIC:  # counted also without a quota: harmless, and simpler
            self._used[project] = used + devices
            self._holds[job_id] = (project, devices)
        return d

    def finished(self, job_id: str) -> None:
        held = self._holds.pop(job_id, None)
        if held is not None:
            project, devices = held
            self._used[project] -= devices


def parse_quotas(text: str) -> Quotas:
    """``project=share,...``; ``*=share`` sets the quota of every project not named."""
    shares: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        project, sep, value = item.partition("=")
        if not sep or not project.strip():
            raise ValidationError(f"bad quota {item!r}: expected project=share", field="quota",
                                  hint="e.g. --quota 'vision=0.4,speech=0.3,*=0.1'")
        try:
            share = float(value)
        except ValueError:
            raise ValidationError(f"bad quota {item!r}: {value!r} is not a number", field="quota",
                                  hint="a share is a number from 0 to 1, e.g. 'vision=0.4'") from None
        if project.strip() in shares:
            raise ValidationError(f"project {project.strip()!r} has two quotas", field="quota",
                                  hint="give each project one share")
        shares[project.strip()] = share
    if not shares:
        raise ValidationError("empty quota specification", field="quota",
                              hint="give at least one project=share, e.g. 'vision=0.4,*=0.1'")
    return Quotas(shares)
