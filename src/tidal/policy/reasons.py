"""Why a job waits: the policy's reason for every job a decision left waiting, in words a user reads.

Each policy says how few devices it would start a waiting job on (:data:`StartSize`); :func:`explain` reads
the view and the decision's actions and gives each job still waiting one :class:`Reason`, the first that
holds of: larger than the cluster; devices being freed for it (preemptions in flight); its owner, or its
project, at its device cap; its project at its quota; waiting behind higher-tier jobs; not enough free devices; free
devices too scattered. A job admitted
at a lower tier than it asked for says so first. The live control plane stores the reason with the job and
shows it; the simulator has no use for it and never asks.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection, Mapping, Sequence

from tidal.core import Action, ActionKind, ClusterView, JobState, JobView
from tidal.policy.device_cap import held_by_owner, held_by_project, smallest_size

WAITING = frozenset({JobState.PENDING, JobState.PREEMPTED})
_STARTS = frozenset({ActionKind.PLACE, ActionKind.RESUME, ActionKind.TIME_SLICE})


class Why(enum.Enum):
    """What keeps a job waiting (a stable code; the reason's text says it in full)."""

    HELD = "held"  # its owner holds it (`tidal preempt`)
    DEFERRED = "deferred"  # admission against the load deferred it: released when its SLA can be met
    TOO_LARGE = "too_large"  # it needs more devices than the cluster has
    NO_NODES = "no_nodes"  # no node is up
    MAKING_ROOM = "making_room"  # jobs are being preempted for it: it starts once their devices are free
    DEVICE_CAP = "device_cap"  # its owner holds as many devices as their cap allows (or it needs more than that)
    PROJECT_CAP = "project_cap"  # its project holds as many devices as its cap allows (or it needs more than that)
    QUOTA = "quota"  # its project is at its quota: it may not take devices from lower tiers
    ADMISSION = "admission"  # admitted at a lower tier than asked for (its project's quota), so it waits longer
    BEHIND = "behind"  # higher-tier jobs wait before it
    NO_DEVICES = "no_devices"  # not enough free devices for the fewest it starts on
    SCATTERED = "scattered"  # enough free devices, but not on few enough nodes
    QUEUED = "queued"  # waiting for the scheduler's next decision


@dataclasses.dataclass(frozen=True)
class Reason:
    why: Why
    text: str

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class Need:
    """The fewest devices a policy would start a job on, and why that many (``"all of them"``, ...)."""

    devices: int
    because: str


#: How a policy sizes a waiting job's start (its elastic start, or the whole job).
StartSize = Callable[[JobView], Need]


def held() -> Reason:
    return Reason(Why.HELD, "held by its owner: `tidal resume` releases it")


def deferred(text: str) -> Reason:
    """Deferred at submission (TIDAL_ADMIT_SLA=defer); ``text``: the admission's reason ("deferred: ...")."""
    return Reason(Why.DEFERRED, text)


def queued() -> Reason:
    return Reason(Why.QUEUED, "waiting for the scheduler")


def making_room(busy: int) -> Reason:
    return Reason(Why.MAKING_ROOM, f"waiting for {busy} device(s) being freed for it (preempted jobs are "
                                   "checkpointing)")


def quota(project: str, used: int, limit: float) -> Reason:
    return Reason(Why.QUOTA, f"project {project!r} is at its quota ({used} of {limit:g} guaranteed devices in "
                             "use): it waits for idle devices")


def device_cap(owner: str, held: int, cap: int, need: int) -> Reason:
    """``owner`` holds ``held`` devices of at most ``cap``; the job starts on ``need`` at the fewest."""
    if need > cap:
        return Reason(Why.DEVICE_CAP, f"needs {need} device(s) at the fewest; user {owner} may hold at most {cap}")
    return Reason(Why.DEVICE_CAP, f"user {owner} holds {held} of at most {cap} devices (it needs {need})")


def project_cap(project: str, held: int, cap: int, need: int) -> Reason:
    """``project`` holds ``held`` devices of at most ``cap``; the job starts on ``need`` at the fewest."""
    if need > cap:
        return Reason(Why.PROJECT_CAP, f"needs {need} device(s) at the fewest; project {project} may hold at most "
                                       f"{cap}")
    return Reason(Why.PROJECT_CAP, f"project {project} holds {held} of at most {cap} devices (it needs {need})")


def whole(job: JobView) -> Need:
    """The whole job: every device it may use."""
    return Need(job.max_d, "all of them" if job.max_d > 1 else "")


def explain(view: ClusterView, actions: Sequence[Action], start_size: StartSize, *,
            room_for: Collection[str] = (),
            over_quota: Callable[[JobView], Reason | None] | None = None,
            cap_need: Callable[[JobView], int] | None = None) -> dict[str, Reason]:
    """The reason of every job of ``view`` left waiting by ``actions``. ``room_for``: jobs for which devices
    are being freed (preemptions asked for or in flight); ``over_quota``: the quota reason of a job, if any;
    ``cap_need``: the fewest devices the policy starts a job on under its owner's and project's device caps (by default
    the smallest size its bounds allow: it is shrunk to fit)."""
    free: dict[str, int] = {n.name: n.devices for n in view.topology.nodes()}
    capacity = sum(free.values())
    taken: set[tuple[str, int]] = set()
    started = {a.job_id for a in actions if a.kind in _STARTS}
    for j in view.jobs.values():
        if j.state not in WAITING:
            taken.update((d.node, d.index) for d in j.devices)
    for a in actions:
        if a.kind in _STARTS or a.kind in (ActionKind.MIGRATE, ActionKind.RESIZE):
            taken.update((d.node, d.index) for d in a.devices)
    for node, _ in taken:
        if node in free:
            free[node] -= 1
    # A drained node's idle devices are not free to a waiting job (said apart, so the count adds up).
    idle_drained = sum(free.pop(n) for n in view.drained if n in free)
    free_total = sum(free.values())
    largest = max(free.values(), default=0)
    waiting = sorted((j for j in view.jobs.values() if j.state in WAITING and j.id not in started),
                     key=lambda j: (-j.tier.rank, j.submitted_at, j.id))
    by_tier: Mapping[int, int] = {r: sum(1 for j in waiting if j.tier.rank > r) for r in (0, 1, 2)}
    capped = _at_cap(view, actions, cap_need) if view.device_caps or view.project_caps else None
    out: dict[str, Reason] = {}
    for j in waiting:
        out[j.id] = _reason(j, start_size(j), capacity, free_total, largest, by_tier[j.tier.rank],
                            j.id in room_for, over_quota, all_drained=capacity > 0 and not free,
                            idle_drained=idle_drained, at_cap=capped)
    return out


def _at_cap(view: ClusterView, actions: Sequence[Action],
            cap_need: Callable[[JobView], int] | None) -> Callable[[JobView], Reason | None]:
    """Whether a waiting job's owner's or project's device cap keeps it waiting, once ``actions`` are applied:
    where both do, the one that leaves it the less room."""
    held, project_held = held_by_owner(view), held_by_project(view)
    for a in actions:
        j = view.jobs.get(a.job_id)
        if j is None:
            continue
        if a.kind in _STARTS and j.state in WAITING:
            n = len(a.devices)
        elif a.kind is ActionKind.RESIZE:
            n = len(a.devices) - len(j.devices)
        else:
            continue
        held[j.owner] = held.get(j.owner, 0) + n
        project_held[j.project] = project_held.get(j.project, 0) + n
    caps, project_caps = view.device_caps, view.project_caps

    def reason(j: JobView) -> Reason | None:
        cap, pcap = caps.get(j.owner), project_caps.get(j.project)
        if cap is None and pcap is None:
            return None
        need = cap_need(j) if cap_need is not None else smallest_size(j.ranks, j.min_devices, j.max_d)
        holding: list[tuple[int, Reason]] = []  # (devices left under the cap, why it waits)
        have = held.get(j.owner, 0)
        if cap is not None and have + need > cap:
            holding.append((cap - have, device_cap(j.owner, have, cap, need)))
        have = project_held.get(j.project, 0)
        if pcap is not None and have + need > pcap:
            holding.append((pcap - have, project_cap(j.project, have, pcap, need)))
        return min(holding, key=lambda h: h[0])[1] if holding else None  # the cap that binds (ties: the user's)

    return reason


def _reason(j: JobView, need: Need, capacity: int, free: int, largest: int, ahead: int, room: bool,
            over_quota: Callable[[JobView], Reason | None] | None, *, all_drained: bool = False,
            idle_drained: int = 0, at_cap: Callable[[JobView], Reason | None] | None = None) -> Reason:
    n = need.devices
    because = f" ({need.because})" if need.because else ""
    if capacity == 0:
        return Reason(Why.NO_NODES, "no node is up")
    if all_drained:
        return Reason(Why.NO_NODES, "every node that is up is drained: none takes new jobs (`tidal nodes` says why)")
    if n > capacity:
        return Reason(Why.TOO_LARGE, f"needs {n} device(s){because}; the cluster has {capacity}")
    if room:
        return Reason(Why.MAKING_ROOM, "waiting for devices being freed for it (preempted jobs are checkpointing)")
    c = at_cap(j) if at_cap is not None else None
    if c is not None:
        return c
    q = over_quota(j) if over_quota is not None else None
    if q is not None:
        return q
    if ahead:
        base = Reason(Why.BEHIND, f"waiting behind {ahead} higher-tier job(s); needs {n} free device(s){because}, "
                                  f"{free} free")
    elif free < n:
        base = Reason(Why.NO_DEVICES, f"needs {n} free device(s){because}, {free} free")
    else:
        base = Reason(Why.SCATTERED, f"needs {n} device(s){because} on as few nodes as they fit; {free} free, at "
                                     f"most {largest} on one node")
    if idle_drained:
        base = Reason(base.why, f"{base.text} ({idle_drained} more idle on drained nodes, which take no new jobs)")
    if j.requested_tier is not None and j.requested_tier > j.tier:
        return Reason(Why.ADMISSION, f"admitted as {j.tier.value}, not {j.requested_tier.value} (its project's "
                                     f"quota was full): {base.text}")
    return base
