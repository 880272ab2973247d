"""Policies by name: the one place that maps a name to a policy, for the simulator, the CLI and the live
control plane.

Every policy runs in the simulator, in the configuration the simulator evaluates (:func:`make_policy`).
A policy that can drive a live cluster also names the configuration it runs there
(:func:`make_live_policy`): the live cluster executes placement, checkpoint preemption, migration and
resizing, but does not time-slice different jobs on one device, and its jobs are minutes long rather than
the days of a trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

from tidal.errors import ValidationError
from tidal.policy.base import Policy
from tidal.policy.baselines.gandiva import Gandiva
from tidal.policy.baselines.ordered import Fifo, Sjf
from tidal.policy.baselines.priority_requeue import PriorityRequeue
from tidal.policy.baselines.srtf import Srtf
from tidal.policy.baselines.tiresias import Tiresias
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.singularity import Singularity, SingularityConfig

#: Tidal's policy on a live cluster: only what the cluster executes (no time-slicing, no defragmenting
#: migrations), and a minimum run time between changes of a job in seconds rather than minutes. Shrunk starts
#: of guaranteed work weigh the run times jobs give (``tidal submit --runtime``); a job that gives none is not
#: started shrunk. Backfill lends a reserving gang's idle devices to lower-tier work, reclaimed by
#: checkpoint when the gang is due (never before it could start, where run times are unknown). Least
#: attained service among equals stays off: its thresholds are set for trace jobs, days long.
LIVE_SINGULARITY = SingularityConfig(min_run_s=5.0, shrink=True, grow=True, time_slice=False, defrag=False,
                                     shrunk_start_tiers=(1, 2), backfill=True)
#: Tidal's policy in the simulator: every step; least attained service first within every tier, by
#: preemption weighed against its cost (policy/equals.py; its one-hour threshold is set for trace jobs,
#: days long, not for a live cluster's minutes-long ones); shrunk starts of guaranteed work when they end
#: earlier than waiting (policy/shrunk_start.py; by the trace's run times, as live by the ones jobs give); a
#: short lane of 35 % of the devices (on Philly at load 1.5, 32 × 8: average JCT 1.10 × Tiresias's with
#: 12 %, 1.02 × with 35 %, standard attainment 0.94 → 0.87; docs/scheduling.md).
#: Backfill lends a reserving gang's idle devices to lower-tier work (policy/reservation.py).
SIM_SINGULARITY = SingularityConfig(equal_preempt_tiers=(0, 1, 2), shrunk_start_tiers=(1, 2), short_lane_share=0.35,
                                    backfill=True)


@dataclasses.dataclass(frozen=True)
class PolicyEntry:
    """One policy name. ``simulated`` builds the configuration the simulator evaluates; ``live`` builds the
    one a live cluster runs, or is None when the policy cannot drive a live cluster."""

    name: str
    simulated: Callable[[], Policy]
    live: Callable[[], Policy] | None = None

    @property
    def runs_live(self) -> bool:
        return self.live is not None


def _sim_singularity() -> Policy:
    return Singularity(SIM_SINGULARITY)


def _live_singularity() -> Policy:
    return Singularity(LIVE_SINGULARITY)


_ENTRIES = (
    PolicyEntry("fifo", Fifo),
    PolicyEntry("priority-requeue", PriorityRequeue),
    PolicyEntry("tiresias", Tiresias),
    PolicyEntry("gandiva", Gandiva),
    PolicyEntry("singularity", _sim_singularity, live=_live_singularity),
    PolicyEntry("sjf", Sjf),
    PolicyEntry("srtf", Srtf),
    PolicyEntry("firstfit", FirstFitPolicy, live=FirstFitPolicy),
)

#: Every policy by name, in the order they are listed to users.
POLICIES: Mapping[str, PolicyEntry] = MappingProxyType({e.name: e for e in _ENTRIES})
#: The names that can drive a live cluster (``tidal up --policy``, ``tidal-control --policy``).
LIVE_POLICIES: tuple[str, ...] = tuple(e.name for e in _ENTRIES if e.runs_live)
#: What a live cluster runs unless told otherwise.
DEFAULT_LIVE_POLICY = "singularity"


def make_policy(name: str) -> Policy:
    """A fresh policy ``name`` in the configuration the simulator evaluates."""
    e = POLICIES.get(name)
    if e is None:
        raise ValidationError(f"unknown policy {name!r}", field="policies",
                              hint="valid policies: " + ", ".join(POLICIES))
    return e.simulated()


def make_live_policy(name: str = DEFAULT_LIVE_POLICY) -> Policy:
    """A fresh policy ``name`` in the configuration it runs on a live cluster."""
    e = POLICIES.get(name)
    if e is None or e.live is None:
        what = (f"unknown policy {name!r}" if e is None
                else f"policy {name!r} runs in the simulator only: it cannot drive a live cluster")
        raise ValidationError(what, field="policy",
                              hint="policies for a live cluster: " + ", ".join(LIVE_POLICIES))
    return e.live()
