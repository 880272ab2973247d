"""Tidal's scheduling policy and the baselines it is compared with: pure, no I/O, no wall clock.

``decide(view, events, now) -> list[Action]``; see :mod:`tidal.policy.base`.
"""

from __future__ import annotations

from tidal.policy.base import BasePolicy, Policy
from tidal.policy.registry import LIVE_POLICIES, POLICIES, make_live_policy, make_policy
from tidal.policy.singularity import Singularity, SingularityConfig

__all__ = [
    "LIVE_POLICIES", "POLICIES", "BasePolicy", "Policy", "Singularity", "SingularityConfig", "make_live_policy",
    "make_policy",
]
