"""Tidal's pure domain model, shared by the simulator and the live control plane.

Nothing here does I/O or reads a clock; the only Tidal import is :mod:`tidal.errors`.
"""

from __future__ import annotations

from tidal.core.actions import LIVE_EXECUTABLE, Action, ActionKind
from tidal.core.events import Event, EventKind
from tidal.core.lifecycle import TERMINAL, TRANSITIONS, JobState, advance, can_advance
from tidal.core.spec import JobSpec
from tidal.core.tiers import Tier
from tidal.core.topology import Cluster, DeviceRef, Node, Region, Topology
from tidal.core.view import ClusterView, JobView, Links, rank_map

__all__ = [
    "LIVE_EXECUTABLE",
    "TERMINAL",
    "TRANSITIONS",
    "Action",
    "ActionKind",
    "Cluster",
    "ClusterView",
    "DeviceRef",
    "Event",
    "EventKind",
    "JobSpec",
    "JobState",
    "JobView",
    "Links",
    "Node",
    "Region",
    "Tier",
    "Topology",
    "advance",
    "can_advance",
    "rank_map",
]
