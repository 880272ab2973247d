"""Tidal's policy, after Singularity: workload-aware, SLA tiers, every mechanism used.

Per decision, pending jobs are taken in :class:`TieredFairQueue` order and each is, in turn:
1. placed at full size on the fewest nodes of the best cluster (global level, placement);
2. for a guaranteed tier (premium, standard) within its project's quota: given room by shrinking, then
   preempting (checkpoint, never kill) lower-tier jobs, lowest tier first (preemption); a job to preempt
   that fits whole on idle devices of another cluster it may run in moves there instead, when the transfer
   of its image takes at most ``spill_max_pause_s`` (spilling);
3. started shrunk on at least ``elastic_start_fraction`` of its devices (replica splicing): basic work
   always, guaranteed work when that ends earlier than waiting (``shrunk_start_tiers``);
4. in ``equal_preempt_tiers``, given devices of a job of its own tier with more attained service, the
   preemption's cost weighed (ordering among equals);
5. given a node by migrating small jobs away (defragmentation);
6. for basic jobs: time-sliced on the devices of a running basic job of the same size.
A guaranteed gang that cannot start reserves nodes; with ``backfill`` their idle devices are lent to
lower-tier work until it is due.
Then shrunk jobs grow into idle devices and time-sliced jobs move to devices of their own.
Basic jobs with little service go through a short lane, right after premium, within a share of the
devices (see ``SingularityConfig.short_lane_device_s``). Within a project's jobs of a tier, and within the
lane, users take turns by the devices they hold (``user_share``); a user's cap on the devices they hold
(``ClusterView.device_caps``), and a project's (``ClusterView.project_caps``), bound every start and growth
(policy/device_cap.py).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections import Counter
from collections.abc import Iterator, Mapping

from tidal.core import ActionKind, DeviceRef, JobView, Links
from tidal.policy.base import BasePolicy
from tidal.policy.defrag import defragment
from tidal.policy.device_cap import capped_size, least, room
from tidal.policy.equals import las_level, may_preempt_equal
from tidal.policy.global_level import candidate_clusters, place
from tidal.policy.growth import grow
from tidal.policy.placement import useful_sizes
from tidal.policy.preemption import Outcome, make_room
from tidal.policy.queue_order import OwnerQueues, TieredFairQueue
from tidal.policy.quota import within_quota
from tidal.policy.reasons import Need, Reason, quota, whole
from tidal.policy.reservation import Reservations
from tidal.policy.shrunk_start import shrunk_finishes_earlier, wait_for_devices_s
from tidal.policy.spill import spill_target
from tidal.policy.state import RUNNING_STATES, JobRec
from tidal.policy.timeslice import find_host, unshare


@dataclasses.dataclass(frozen=True)
class SingularityConfig:
    min_run_s: float = 300.0  # no preemption/resize/migration within this of a job's last change
    las_threshold_device_s: float = 3600.0  # within a tier and project: < 1 device-hour of service first
    las_tiers: tuple[int, ...] = (0,)  # LAS order for basic only; guaranteed tiers in arrival order
    # Basic queues split at 1, 10 and 100 device-hours: a backlog drains smallest first (mean JCT).
    las_levels: int = 4
    fair_share: bool = True
    # Within a project's jobs of a tier (and within the short lane), users take turns: the user holding the
    # fewest devices goes next (policy/queue_order.py). Off: the project's jobs in one queue.
    user_share: bool = True
    project_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    quotas: Mapping[str, float] = dataclasses.field(default_factory=dict)  # project → share of capacity
    shrink: bool = True
    grow: bool = True
    elastic_start_fraction: float = 0.5  # start shrunk on ≥ this fraction of W devices, never below min
    elastic_start_tiers: tuple[int, ...] = (0,)
    defrag: bool = True
    max_migrations: int = 4
    # Off by default: on the Philly trace time-slicing basic jobs raised preemption churn and lowered
    # standard attainment and goodput (docs/simulator.md); the step stays available.
    time_slice: bool = False
    preempt: bool = True  # guaranteed tiers take devices from lower tiers
    reserve: bool = True  # the first waiting gang of each guaranteed tier drains nodes for itself
    # Short lane: basic jobs with less service than this are considered right after premium, before
    # waiting standard work, while jobs started from the lane hold at most ``short_lane_share`` of the
    # devices; standard work may not preempt those (premium may, and so may the gang a reservation is
    # draining nodes for). 0 turns the lane off. Without it, at load 1.5 on Philly every basic job, a
    # 5-minute one too, waited out weeks of guaranteed backlog (docs/simulator.md).
    short_lane_device_s: float = 14_400.0
    short_lane_share: float = 0.12
    # Ordering among equals (policy/equals.py): in these tiers a waiting job with less than
    # ``las_threshold_device_s`` of service preempts a running job of its tier that has more, once that
    # job has run ``equal_cost_ratio`` × ``equal_pause_s`` (a checkpoint and restore of a 6.2 GB rank
    # under the simulator's fitted cost model: ≈ 13 s) and ``min_run_s`` since its last change.
    equal_preempt_tiers: tuple[int, ...] = ()
    equal_pause_s: float = 13.0
    equal_cost_ratio: float = 30.0
    # Shrunk starts for guaranteed work (policy/shrunk_start.py): a job of these tiers whose full size is
    # not free starts on fewer devices when, by the running jobs' remaining times (the oracle hints; none
    # live), that ends earlier than waiting; it grows back as devices free up.
    shrunk_start_tiers: tuple[int, ...] = ()
    timeslice_efficiency: float = 0.945  # per-device speed of ranks sharing a device (the cost model's)
    # Backfill (policy/reservation.py): reserved nodes' idle devices are lent to lower-tier work while the
    # gang is due in more than ``min_lend_s`` (by the running jobs' remaining times), reclaimed by checkpoint.
    backfill: bool = False
    min_lend_s: float = 300.0
    # Spilling (policy/spill.py): a lower-tier job that would be preempted to make room moves whole to idle
    # devices of another cluster it may run in, when the transfer of its image there (over the view's
    # ``links``) takes at most ``spill_max_pause_s``. A job whose image size is not in the view counts
    # ``spill_rank_image_gb`` per rank (the simulator's mean rank image, sim/cost.py).
    spill: bool = True
    spill_max_pause_s: float = 600.0
    spill_rank_image_gb: float = 6.2


REDECIDE_S = 1e-3  # how soon a decision that preempted asks for the next one


class Singularity(BasePolicy):
    name = "singularity"

    def __init__(self, cfg: SingularityConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or SingularityConfig()
        self.queue = self._new_queue()
        self.shrunk: dict[str, None] = {}
        self.sharable: dict[int, dict[str, None]] = {}
        self.guests: dict[str, None] = {}
        self._preempted_now: set[str] = set()
        self._ts_failed: set[int] = set()
        self._ts_budget = 16
        self.reservations = Reservations()
        self._hidden = False
        self._cluster_devices: dict[str, int] = {}
        # Pending jobs per tier by (smallest useful size, W), and those looked at in this decision.
        self._kinds: list[Counter[tuple[int, int]]] = [Counter(), Counter(), Counter()]
        self._visited: list[Counter[tuple[int, int]]] = [Counter(), Counter(), Counter()]
        self._visited_ids: set[str] = set()
        self._open_kind: list[tuple[int, int] | None] = [None, None, None]  # see _tier_exhausted
        self.lane = OwnerQueues(_arrival, self.cfg.user_share)
        self.lane_held: dict[str, int] = {}  # basic jobs started from the lane → devices
        self._lane_devices = 0
        self._lane_until: list[tuple[float, int, str]] = []  # when each leaves the lane (its service)
        self._horizons: dict[str, float] = {}  # reserved-for gang → seconds until due, in this decision
        # Failed searches for room in this decision, by everything they read: a job of the same tier and
        # size, on the same clusters and reserved nodes shown, fails alike until a job starts, stops or moves.
        self._no_room: dict[tuple[object, ...], Outcome] = {}
        self._no_fit: set[tuple[object, ...]] = set()  # placements that failed likewise
        self._shown: tuple[str, ...] = ()  # the reserved nodes shown to the job being tried
        self._caps: Mapping[str, int] = {}  # the users' device caps, in this decision
        self._project_caps: Mapping[str, int] = {}  # the projects' device caps, in this decision

    @property
    def grows(self) -> bool:
        return self.cfg.grow

    def _new_queue(self) -> TieredFairQueue:
        cfg = self.cfg
        return TieredFairQueue(cfg.las_threshold_device_s, cfg.project_weights, cfg.fair_share, cfg.las_tiers,
                               cfg.las_levels, cfg.user_share)

    # ---- the owner's and the project's device caps ----------------------------------------------------
    def device_room(self, rec: JobRec) -> int | None:
        """Devices ``rec`` may still take: the smaller of what its owner's cap and its project's leave (None:
        neither has a cap)."""
        if not self._caps and not self._project_caps:
            return None
        st = self.st
        assert st is not None
        return least(room(self._caps, st.owner_usage, rec.owner), room(self._project_caps, st.usage, rec.project))

    def _cap_size(self, rec: JobRec) -> int:
        """The most devices waiting ``rec`` may start on under its owner's and its project's caps (0: none)."""
        return capped_size(rec.W, rec.lo, rec.hi, self.device_room(rec))

    def _binding_cap(self, rec: JobRec) -> str:
        """Whose cap leaves ``rec`` the least room: its owner's, or its project's."""
        st = self.st
        assert st is not None
        own = room(self._caps, st.owner_usage, rec.owner)
        project = room(self._project_caps, st.usage, rec.project)
        return "its project's" if project is not None and (own is None or project < own) else "its owner's"

    # ---- why a job waits ----------------------------------------------------------------------------
    def start_size(self, job: JobView) -> Need:
        """Work of an elastic-start tier starts on ``elastic_start_fraction`` of its devices or more (never
        below its minimum); other work whole, unless it is larger than any cluster."""
        cfg = self.cfg
        biggest = max(self._cluster_devices.values(), default=job.max_d)
        if job.tier.rank in cfg.elastic_start_tiers or job.max_d > biggest:
            n = _smallest(job.ranks, job.min_devices, job.max_d, cfg.elastic_start_fraction)
            if n < job.max_d:
                floor = math.ceil(job.ranks * cfg.elastic_start_fraction)
                why = (f"an elastic job starts on at least {cfg.elastic_start_fraction:.0%} of its {job.ranks}"
                       if job.min_devices <= floor else f"its minimum of {job.min_devices}")
                return Need(n, why)
        return whole(job)

    def over_quota(self, job: JobView) -> Reason | None:
        share = self.cfg.quotas.get(job.project)
        if share is None or job.tier.rank == 0 or self._view is None:
            return None
        view = self._view
        used = sum(len(j.devices) for j in view.jobs.values()
                   if j.project == job.project and j.tier.rank > 0 and j.state in RUNNING_STATES)
        limit = share * sum(n.devices for n in view.topology.nodes())
        return quota(job.project, used, limit) if used + job.ranks > limit else None

    # ---- indexes ------------------------------------------------------------------------------------
    def on_rebuild(self, now: float) -> None:
        st = self.st
        assert st is not None
        self._cluster_devices = {c.name: c.devices for c in st.topology.clusters()}
        self.queue = self._new_queue()
        self.shrunk, self.sharable, self.guests = {}, {}, {}
        self.lane = OwnerQueues(_arrival, self.cfg.user_share)
        self.lane_held, self._lane_devices, self._lane_until = {}, 0, []
        self._kinds = [Counter(), Counter(), Counter()]
        waiting = list(st.pending.values())
        self.queue.add_many(waiting)
        for rec in waiting:
            self._kinds[rec.tier][self._kind(rec)] += 1
        lane = [r for r in waiting if r.tier == 0 and r.attained < self.cfg.short_lane_device_s]
        if lane:
            self.lane.add_many(lane)
        for rec in st.running.values():
            self.on_changed(rec)
            if rec.shared:
                self.guests[rec.id] = None  # after a rebuild the guest/host roles are unknown: both may move
        # Which jobs came from the short lane is not in the view: take the short basic jobs, oldest start
        # first, up to the lane's share.
        thr, cap = self.cfg.short_lane_device_s, self.cfg.short_lane_share * st.capacity
        short = sorted((r for r in st.running.values() if r.tier == 0 and r.service(now) < thr),
                       key=lambda r: (r.started_at, r.seq))
        for rec in short:
            if self._lane_devices + len(rec.devices) <= cap:
                self._lane(rec)

    def on_pending(self, rec: JobRec, now: float) -> None:
        if rec not in self.queue:
            self._kinds[rec.tier][self._kind(rec)] += 1
        self.queue.add(rec)
        if rec.tier == 0 and rec.attained < self.cfg.short_lane_device_s:
            self.lane.add(rec)

    def on_gone(self, rec: JobRec, now: float) -> None:
        self._forget()
        if rec.id in self.reservations.by_job:
            assert self.st is not None
            self.reservations.drop(rec.id, self.st, hidden=self._hidden)
        self.lane.remove(rec)
        if self.queue.remove(rec):
            k = self._kind(rec)
            self._kinds[rec.tier][k] -= 1
            if self._visited[rec.tier][k] > 0 and rec.id in self._visited_ids:
                self._visited[rec.tier][k] -= 1
        self._unindex(rec)

    def on_drained(self, nodes: frozenset[str]) -> None:
        """A reservation that holds a drained node could never start its gang there: it is made again."""
        st = self.st
        assert st is not None
        for jid in [j for j, (_, held) in self.reservations.by_job.items() if nodes.intersection(held)]:
            self.reservations.drop(jid, st, hidden=False)

    def _forget(self) -> None:
        """A job started, stopped or moved, or nodes were reserved: what this decision learnt no longer holds."""
        self._horizons.clear()
        self._no_room.clear()
        self._no_fit.clear()

    def _place(self, rec: JobRec, n: int) -> list[DeviceRef] | None:
        """``place`` for ``n`` devices of ``rec``, packing guaranteed work; a failure is kept for the decision
        (it reads only the clusters, the size, whether the job is guaranteed and the nodes shown)."""
        st = self.st
        assert st is not None
        key = (tuple(candidate_clusters(st, rec)), n, rec.tier > 0, self._shown)
        if key in self._no_fit:
            return None
        devs = place(st, rec, n, affinity=True)
        if devs is None:
            self._no_fit.add(key)
        return devs

    def _kind(self, rec: JobRec) -> tuple[int, int]:
        return (_smallest(rec.W, rec.lo, rec.hi, self.cfg.elastic_start_fraction), rec.W)

    def _tier_exhausted(self, tier: int, fmin: int, sharing: bool) -> bool:
        """True when no job of ``tier`` not yet looked at in this decision could start: all are at least
        as large as one that just failed, and none can be time-sliced. Avoids O(queue) scans per event."""
        seen, kinds = self._visited[tier], self._kinds[tier]
        ts_failed, sharable = self._ts_failed, self.sharable
        # The kind that kept the tier open last time most often still does: look at it first.
        last = self._open_kind[tier]
        if last is not None:
            small, w = last
            if (small < fmin or (sharing and w not in ts_failed and sharable.get(w))) and (
                    kinds.get(last, 0) - seen.get(last, 0) > 0):
                return False
        for kind, n in kinds.items():
            small, w = kind
            if (small < fmin or (sharing and w not in ts_failed and sharable.get(w))) and (
                    n - seen.get(kind, 0) > 0):
                self._open_kind[tier] = kind
                return False
        return True

    def _unindex(self, rec: JobRec) -> None:
        self._lane_devices -= self.lane_held.pop(rec.id, 0)
        self.shrunk.pop(rec.id, None)
        self.guests.pop(rec.id, None)
        s = self.sharable.get(rec.W)
        if s is not None:
            s.pop(rec.id, None)

    def on_changed(self, rec: JobRec) -> None:
        self._forget()
        guest = rec.id in self.guests
        lane = rec.id in self.lane_held
        self._unindex(rec)
        if not rec.running:
            return
        if lane:
            self._lane(rec)
        if rec.shared:
            if guest:
                self.guests[rec.id] = None
            return
        if len(rec.devices) < rec.hi:
            self.shrunk[rec.id] = None
        elif rec.tier == 0 and len(rec.devices) == rec.W:
            self.sharable.setdefault(rec.W, {})[rec.id] = None

    # ---- the decision -------------------------------------------------------------------------------
    def _lane(self, rec: JobRec) -> None:
        self.lane_held[rec.id] = len(rec.devices)
        self._lane_devices += len(rec.devices)
        left = (self.cfg.short_lane_device_s - rec.attained) / max(len(rec.devices), 1)
        heapq.heappush(self._lane_until, (rec.started_at + left, rec.seq, rec.id))

    def _lane_expire(self, now: float) -> None:
        """Jobs whose service reached the lane's limit leave it (a heap by the time they reach it, so the
        work per decision does not grow with the lane)."""
        st = self.st
        assert st is not None
        thr = self.cfg.short_lane_device_s
        due: list[tuple[float, int, str]] = []
        while self._lane_until and self._lane_until[0][0] <= now:
            due.append(heapq.heappop(self._lane_until))
        for _, seq, jid in due:
            rec = st.jobs.get(jid)
            if rec is None or jid not in self.lane_held:
                continue
            if rec.service(now) >= thr:
                self._lane_devices -= self.lane_held.pop(jid)
            else:  # rounding, or the job changed size since: look again later
                left = (thr - rec.service(now)) / max(len(rec.devices), 1)
                heapq.heappush(self._lane_until, (max(now + left, now + 1e-9), seq, jid))

    def _candidates(self, new: list[JobRec], freed: bool) -> Iterator[tuple[bool, Iterator[JobRec]]]:
        """Per tier, highest first, the jobs to consider: all waiting ones after devices were freed,
        else only the new arrivals (nothing else changed for the others). The short lane (basic jobs
        with little service, ``True``) comes between premium and standard."""
        st = self.st
        assert st is not None
        lane = self.cfg.short_lane_device_s > 0
        if not freed:
            for tier in (2, 1, 0):
                if tier == 1 and lane:
                    yield True, self._in_turn([r for r in new if r in self.lane], None)
                yield False, self._in_turn([r for r in new if r.tier == tier], tier)
            return
        for tier in (2, 1, 0):
            if tier == 1 and lane:
                yield True, self.lane.iter(st.owner_usage)
            yield False, self.queue.iter_tier(tier, st.usage, st.owner_usage)

    def _in_turn(self, recs: list[JobRec], tier: int | None) -> Iterator[JobRec]:
        """New arrivals of ``tier`` (None: of the short lane) in the order the whole queue takes them: by
        arrival, or, where they are several users', with users taking turns as in the queue (so that the
        simulator, which weighs only the new arrivals, decides as the live loop, which rebuilds every pass)."""
        recs.sort(key=lambda r: r.seq)
        if len(recs) < 2 or not self.cfg.user_share or len({r.owner for r in recs}) < 2:
            return iter(recs)
        st = self.st
        assert st is not None
        if tier is None:
            lane = OwnerQueues(_arrival)
            lane.add_many(recs)
            return lane.iter(st.owner_usage)
        q = self._new_queue()
        q.add_many(recs)
        return q.iter_tier(tier, st.usage, st.owner_usage)

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        cfg = self.cfg
        failed: dict[tuple[int, tuple[str, ...]], int] = {}  # (tier, clusters) → smallest size that failed
        wake: list[float] = []
        self._preempted_now = set()
        self._caps = self._view.device_caps if self._view is not None else {}
        self._project_caps = self._view.project_caps if self._view is not None else {}
        self._releases: list[tuple[float, int]] | None = None
        self._now = now
        self._ts_failed = set()
        self._ts_budget = 16  # time-slice attempts once the cluster is full: bounded work per decision
        self._visited = [Counter(), Counter(), Counter()]
        self._visited_ids = set()
        self._forget()
        everywhere = tuple(st.cluster_names)
        self.reservations.hide(st)
        self._hidden = True
        if cfg.short_lane_device_s > 0:
            self._lane_expire(now)
        cap = cfg.short_lane_share * st.capacity
        try:
            for lane, tier_jobs in self._candidates(new, freed):
                for rec in tier_jobs:
                    if lane:
                        if self._lane_devices + rec.hi > cap:
                            if self._lane_devices + 1 > cap:
                                break
                            continue
                        if not self._consider(rec, now, failed, wake, everywhere):
                            break
                        if rec.running:
                            self._lane(rec)
                    elif not self._consider(rec, now, failed, wake, everywhere):
                        break
            if cfg.grow:
                grow(self, now)
            if cfg.time_slice:
                unshare(self, now)
        finally:
            self.reservations.show(st)
            self._hidden = False
        if self._preempted_now and st.free_total and any(
                self._kind(st.jobs[j])[0] <= st.free_total for j in self._preempted_now if j in st.pending):
            # A job preempted in this decision was left for the next one (no churn within a decision);
            # ask for that next one at once, as the live loop's next pass does, so that it may resume on
            # devices left free rather than wait for the next arrival or finish.
            wake.append(now + REDECIDE_S)
        if wake:
            self._wakeup = min(wake)

    def _consider(self, rec: JobRec, now: float, failed: dict[tuple[int, tuple[str, ...]], int],
                  wake: list[float], everywhere: tuple[str, ...]) -> bool:
        """Try one waiting job; False when no later job of the same tier can start either."""
        st = self.st
        assert st is not None
        cfg = self.cfg
        if rec.id not in st.pending or rec.id in self._preempted_now:
            return True  # a job preempted in this decision waits for the next one: no churn
        kind = self._kind(rec)
        if rec.id not in self._visited_ids:
            self._visited[rec.tier][kind] += 1
            self._visited_ids.add(rec.id)
        hi = self._cap_size(rec) if self._caps or self._project_caps else rec.hi
        if hi == 0:
            return True  # its owner (or its project) is at its device cap: it waits; other users' jobs may start
        sharing = cfg.time_slice and rec.tier == 0
        if not sharing and failed.get((rec.tier, everywhere), 1 << 30) <= 1:
            return False  # even a 1-device job of this tier could not start
        equals = (rec.tier in cfg.equal_preempt_tiers and st.tier_devices[rec.tier] > 0
                  and las_level(rec.service(now), cfg.las_threshold_device_s) == 0)
        allowed = self.reservations.allowed(rec, self._horizon if cfg.backfill else None, cfg.min_lend_s)
        # Reserved nodes are hidden from the free count: a job that may borrow them looks further.
        borrow = cfg.backfill and st.free_total == 0 and any(st.free_idx[n] for n in allowed)
        if st.free_total == 0 and not equals and not borrow:
            if rec.tier > 0:
                if not (cfg.preempt and sum(st.tier_devices[: rec.tier]) > 0):
                    return False
            elif not sharing:
                return False
            else:
                self._ts_budget -= 1
                if self._ts_budget < 0:
                    return False
                if rec.W in self._ts_failed:
                    return True
        clusters = candidate_clusters(st, rec)
        memo = (rec.tier, tuple(clusters))
        smallest = kind[0] if kind[0] <= hi else hi
        if failed.get(memo, 1 << 30) > smallest or allowed:
            for n in allowed:
                st.node_up(n)
            self._shown = tuple(allowed)
            try:
                started = self._try(rec, clusters, now, wake, hi)
            finally:
                for n in allowed:
                    if any(n in nodes for _, nodes in self.reservations.by_job.values()):
                        st.node_down(n)
            if started:
                return True
            # A job its owner's (or project's) cap shrinks reserves nothing: its size changes as their other jobs
            # end.
            if cfg.reserve and rec.tier > 0 and rec.id not in self.reservations.by_job and hi == rec.hi:
                self.reservations.make(self, rec, clusters)
                self._forget()  # its nodes are hidden now
            failed[memo] = min(failed.get(memo, 1 << 30), smallest)
        elif sharing:
            self._share_step(rec, now)
        if memo[1] == everywhere:
            return not self._tier_exhausted(rec.tier, failed.get(memo, 1 << 30), sharing)
        return True

    def _try(self, rec: JobRec, clusters: list[str], now: float, wake: list[float], hi: int) -> bool:
        """Start ``rec`` on at most ``hi`` devices (its full size, or what its owner's and project's caps leave)."""
        st = self.st
        assert st is not None
        cfg = self.cfg
        capped = f"on {hi} of {rec.hi} device(s): {self._binding_cap(rec)} device cap" if hi < rec.hi else ""
        devs = self._place(rec, hi)
        if devs is not None:
            self.start(rec, devs, now, reason=capped)
            return True
        if cfg.preempt and rec.tier > 0 and within_quota(st, rec, cfg.quotas):
            tier = rec.tier
            # Jobs of the short lane are left to finish, except for premium and for the gang that drains
            # nodes (else a stream of short jobs could keep it off them for ever).
            gang = tier == 2 or rec.id in self.reservations.by_job
            held = {} if gang else self.lane_held
            key: tuple[object, ...] = ("tier", tier, gang, hi, tuple(clusters), self._shown)
            out = self._no_room.get(key) or make_room(
                st, clusters, hi, now,
                eligible=lambda j: j.tier < tier and j.id not in held,
                order=lambda j: (float(j.tier), -j.last_change),
                min_run_s=cfg.min_run_s, shrink=cfg.shrink, below_tier=tier,
            )
            if out.plan is None:
                self._no_room[key] = out
            if out.plan is not None:
                for victim, keep in out.plan.shrinks:
                    self.move(victim, keep, now, kind=ActionKind.RESIZE,
                              reason=f"shrink {len(victim.devices)}->{len(keep)} for {rec.id}")
                for victim in out.plan.victims:
                    if cfg.spill and self._spill(victim, rec, now):
                        continue
                    self._preempted_now.add(victim.id)
                    self.preempt(victim, now, reason=f"make room for {rec.id}")
                devs = self._place(rec, hi)
                if devs is not None:
                    self.start(rec, devs, now, reason="after preemption" + (f", {capped}" if capped else ""))
                    return True
            elif out.wake is not None:
                wake.append(out.wake)
        # Elastic start for basic work only: a guaranteed job started shrunk would run slowly for long
        # (devices rarely free up at high load), which costs more attainment than waiting for room.
        lo = max(rec.lo, math.ceil(rec.W * cfg.elastic_start_fraction))
        never_whole = rec.hi > max((self._cluster_devices[c] for c in clusters), default=rec.hi)
        shrunk_ok = rec.tier in cfg.elastic_start_tiers or never_whole  # or it could never start at all
        weigh = not shrunk_ok and rec.tier in cfg.shrunk_start_tiers and rec.remaining is not None
        sizes = useful_sizes(rec.W, lo, hi - 1) if st.free_total and (shrunk_ok or weigh) else ()
        wait_s: float | None = None
        for size in sizes:
            if weigh:
                if wait_s is None:
                    wait_s = self._wait_for(hi, now)
                if not shrunk_finishes_earlier(rec.W, size, rec.remaining_at(now), wait_s,
                                               pause_s=cfg.equal_pause_s, efficiency=cfg.timeslice_efficiency):
                    continue
            devs = self._place(rec, size)
            if devs is not None:
                self.start(rec, devs, now, reason=f"elastic start on {size}" if not weigh
                           else f"shrunk start on {size}: ends before {hi} free up")
                return True
        if rec.tier in cfg.equal_preempt_tiers and self._preempt_equals(rec, clusters, now, hi):
            return True
        if cfg.defrag and st.free_total >= hi:
            for c in clusters:
                devs = defragment(self, rec, hi, c, now, max_moves=cfg.max_migrations,
                                  min_run_s=cfg.min_run_s)
                if devs is not None:
                    self.start(rec, devs, now, reason="after defragmentation")
                    return True
        return cfg.time_slice and rec.tier == 0 and self._share_step(rec, now)

    def _spill(self, victim: JobRec, rec: JobRec, now: float) -> bool:
        """Move ``victim``, which ``rec`` needs the devices of, to another cluster rather than preempt it,
        where policy/spill.py's rule allows."""
        st = self.st
        assert st is not None
        links = self._view.links if self._view is not None else Links()
        target = spill_target(st, victim, links, max_pause_s=self.cfg.spill_max_pause_s,
                              rank_image_gb=self.cfg.spill_rank_image_gb)
        if target is None:
            return False
        cluster, devs, pause = target
        self.move(victim, devs, now, kind=ActionKind.MIGRATE,
                  reason=f"make room for {rec.id}: to idle devices of cluster {cluster} rather than preempted "
                         f"(its image there in ~{pause:.0f} s)")
        return True

    def _horizon(self, gang_id: str) -> float:
        """Seconds until the reserved-for gang ``gang_id`` is due: when the work on its nodes that it may not
        preempt (its tier and above) has ended, by their remaining times (unknown: never). Kept for the
        decision until a job starts, stops or moves."""
        due = self._horizons.get(gang_id)
        if due is None:
            due = self._horizons[gang_id] = self._horizon_now(gang_id)
        return due

    def _horizon_now(self, gang_id: str) -> float:
        st = self.st
        assert st is not None
        tier, nodes = self.reservations.by_job[gang_id]
        due = 0.0
        for n in nodes:
            for jid in st.node_jobs[n]:
                j = st.jobs[jid]
                if j.tier >= tier:
                    due = max(due, j.remaining_at(self._now) if j.remaining is not None else math.inf)
        return due

    def _wait_for(self, need: int, now: float) -> float:
        """Seconds until ``need`` devices are free by the running jobs' remaining times (unknown: never)."""
        st = self.st
        assert st is not None
        if self._releases is None:  # once a decision: the running jobs' ends, soonest first
            self._releases = sorted((r.remaining_at(now) if r.remaining is not None else math.inf, len(r.devices))
                                    for r in st.running.values())
        return wait_for_devices_s(need, st.free_total, self._releases)

    def _preempt_equals(self, rec: JobRec, clusters: list[str], now: float, hi: int) -> bool:
        """Least attained service first within the tier, the preemption's cost weighed (policy/equals.py)."""
        st = self.st
        assert st is not None
        cfg = self.cfg
        thr = cfg.las_threshold_device_s
        mine = rec.service(now)
        if las_level(mine, thr) > 0:
            return False
        tier = rec.tier
        held = self.lane_held

        def eligible(j: JobRec) -> bool:
            return (j.tier == tier and j.id not in held and not j.shared and may_preempt_equal(
                mine, j.service(now), now - j.last_change, threshold=thr, pause_s=cfg.equal_pause_s,
                cost_ratio=cfg.equal_cost_ratio, min_run_s=cfg.min_run_s))

        # Whom it may preempt does not depend on its own service (below the threshold, checked above): the
        # same search for a job of the tier and size fails alike.
        key: tuple[object, ...] = ("equal", tier, hi, tuple(clusters), self._shown)
        out = self._no_room.get(key) or make_room(st, clusters, hi, now, eligible=eligible,
                                                  order=lambda j: (-j.service(now), -j.submit),
                                                  min_run_s=cfg.min_run_s, shrink=False, below_tier=None)
        if out.plan is None:
            self._no_room[key] = out
            return False
        for victim in out.plan.victims:
            self._preempted_now.add(victim.id)
            self.preempt(victim, now, reason=f"least attained service: {rec.id} has less")
        devs = place(st, rec, hi, affinity=True)
        if devs is None:
            return False
        self.start(rec, devs, now, reason="after preempting a job of its tier with more service")
        return True

    def _share_step(self, rec: JobRec, now: float) -> bool:
        if rec.W in self._ts_failed:
            return False
        left = self.device_room(rec)
        if left is not None and left < rec.W:
            return False  # a guest holds its host's W devices too: its owner's and project's caps must allow them
        host = find_host(self, rec, now)
        if host is None:
            self._ts_failed.add(rec.W)
            return False
        self.share(rec, host, now)
        self.guests[rec.id] = None
        return True


def _arrival(rec: JobRec) -> tuple[float, ...]:
    return (rec.submit,)


@functools.lru_cache(maxsize=4096)
def _smallest(w: int, lo: int, hi: int, fraction: float) -> int:
    """The fewest devices the job may start on (elastic start), or its full size."""
    sizes = useful_sizes(w, max(lo, math.ceil(w * fraction)), hi)
    return sizes[-1] if sizes else hi
