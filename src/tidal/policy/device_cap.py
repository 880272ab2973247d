"""A cap on the devices one user holds at once (``ClusterView.device_caps``: user → most devices).

The policy never places, resumes or grows a job whose owner would then hold more than their cap: jobs of
every project and tier count, as held now. An elastic job is started shrunk to fit what is left under the
cap, down to its minimum (``min_devices``), on a size replica splicing makes worth it; a job that does not
fit even so waits, and its reason says whose cap holds it. A cap lowered below what a user holds stops new
starts and growth; their running jobs are left as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidal.core import ClusterView, JobState
from tidal.policy.placement import useful_sizes

_WAITING = frozenset({JobState.PENDING, JobState.PREEMPTED})


def room(caps: Mapping[str, int], held: Mapping[str, int], owner: str) -> int | None:
    """Devices ``owner`` may still take under their cap (0 or fewer: none); None where they have no cap."""
    cap = caps.get(owner)
    return None if cap is None else cap - held.get(owner, 0)


def capped_size(w: int, lo: int, hi: int, room: int | None) -> int:
    """The most devices a W-rank job of ``lo`` to ``hi`` devices may start on with ``room`` left under its
    owner's cap (None: no cap): ``hi`` when it fits whole, else the largest useful size in between, else 0
    (it cannot start)."""
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
    held: dict[str, int] = {}
    for j in view.jobs.values():
        if j.state not in _WAITING and j.placement:
            held[j.owner] = held.get(j.owner, 0) + len(j.devices)
    return held
