"""Caps on the devices one user, or one project, holds at once (``ClusterView.device_caps``: user → most
devices; ``ClusterView.project_caps``: project → most devices).

The policy never places, resumes or grows a job whose owner, or whose project, would then hold more than its
cap: for a user's cap jobs of every project and tier count, for a project's jobs of every user and tier, as
held now. A job's room is the smaller of the two. An elastic job is started shrunk to fit what is left under
the caps, down to its minimum (``min_devices``), on a size replica splicing makes worth it; a job that does
not fit even so waits, and its reason says whose cap holds it. A cap lowered below what a user (project)
holds stops new starts and growth; the running jobs are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidal.core import ClusterView, JobState, JobView
from tidal.policy.placement import useful_sizes

_WAITING = frozenset({JobState.PENDING, JobState.PREEMPTED})


def room(caps: Mapping[str, int], held: Mapping[str, int], owner: str) -> int | None:
    """Devices ``owner`` (a user, or a project) may still take under its cap (0 or fewer: none); None where it
    has no cap."""
    cap = caps.get(owner)
    return None if cap is None else cap - held.get(owner, 0)


def least(a: int | None, b: int | None) -> int | None:
    """The smaller of two rooms (None: no cap)."""
    return b if a is None else a if b is None else min(a, b)


def capped_size(w: int, lo: int, hi: int, room: int | None) -> int:
    """The most devices a W-rank job of ``lo`` to ``hi`` devices may start on with ``room`` left under its
    owner's and its project's caps (None: no cap): ``hi`` when it fits whole, else the largest useful size in
    between, else 0 (it cannot start)."""
    if room is None or room >= hi:
        return hi
    sizes = useful_sizes(w, lo, room) if room >= lo else ()
    return sizes[0] if sizes else 0


def smallest_size(w: int, lo: int, hi: int) -> int:
    """The fewest devices a job may be shrunk to under a cap: the smallest useful size from ``lo``."""
    sizes = useful_sizes(w, lo, hi)
    return sizes[-1] if sizes else hi


def held_by_owner(view: ClusterView) -> dict[str, int]:
    """Devices each user's jobs hold in ``view`` (distinct devices per job; waiting jobs hold none)."""
    return _held(view, lambda j: j.owner)


def held_by_project(view: ClusterView) -> dict[str, int]:
    """Devices each project's jobs hold in ``view`` (distinct devices per job; waiting jobs hold none)."""
    return _held(view, lambda j: j.project)


def _held(view: ClusterView, key: Callable[[JobView], str]) -> dict[str, int]:
    held: dict[str, int] = {}
    for j in view.jobs.values():
        if j.state not in _WAITING and j.placement:
            k = key(j)
            held[k] = held.get(k, 0) + len(j.devices)
    return held
