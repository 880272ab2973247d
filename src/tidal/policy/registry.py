"""Policies by name, for the simulator and the CLI."""

from __future__ import annotations

from collections.abc import Callable

from tidal.errors import ValidationError
from tidal.policy.base import BasePolicy
from tidal.policy.baselines.gandiva import Gandiva
from tidal.policy.baselines.ordered import Fifo, Sjf
from tidal.policy.baselines.priority_requeue import PriorityRequeue
from tidal.policy.baselines.srtf import Srtf
from tidal.policy.baselines.tiresias import Tiresias
from tidal.policy.singularity import Singularity

POLICIES: dict[str, Callable[[], BasePolicy]] = {
    "fifo": Fifo,
    "priority-requeue": PriorityRequeue,
    "tiresias": Tiresias,
    "gandiva": Gandiva,
    "singularity": Singularity,
    "sjf": Sjf,
    "srtf": Srtf,
}


def make_policy(name: str) -> BasePolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValidationError(
            f"unknown policy {name!r}", field="policies", hint="valid policies: " + ", ".join(POLICIES)
        ) from None
