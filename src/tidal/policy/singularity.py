"""Tidal's policy, after Singularity: workload-aware, SLA tiers, every mechanism used.

Per decision, pending jobs are taken in :class:`TieredFairQueue` order and each is, in turn:
1. placed at full size on the fewest nodes of the best cluster (global level, placement);
2. for a guaranteed tier (premium, standard) within its project's quota: given room by shrinking, then
   preempting (checkpoint, never kill) lower-tier jobs, lowest tier first (preemption);
3. started shrunk on at least ``elastic_start_fraction`` of its devices (replica splicing);
4. given a node by migrating small jobs away (defragmentation);
5. for basic jobs: time-sliced on the devices of a running basic job of the same size.
Then shrunk jobs grow into idle devices and time-sliced jobs move to devices of their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping

from tidal.core import ActionKind
from tidal.policy.base import BasePolicy
from tidal.policy.defrag import defragment
from tidal.policy.global_level import candidate_clusters, place
from tidal.policy.growth import grow
from tidal.policy.placement import useful_sizes
from tidal.policy.preemption import make_room
from tidal.policy.queue_order import TieredFairQueue
from tidal.policy.quota import within_quota
from tidal.policy.state import JobRec
from tidal.policy.timeslice import find_host, unshare


@dataclasses.dataclass(frozen=True)
class SingularityConfig:
    min_run_s: float = 300.0  # no preemption/resize/migration within this of a job's last change
    las_threshold_device_s: float = 3600.0  # within a tier and project: < 1 device-hour of service first
    fair_share: bool = True
    project_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    quotas: Mapping[str, float] = dataclasses.field(default_factory=dict)  # project → share of capacity
    shrink: bool = True
    grow: bool = True
    elastic_start_fraction: float = 0.5  # start shrunk on ≥ this fraction of W devices, never below min
    defrag: bool = True
    max_migrations: int = 4
    time_slice: bool = True
    preempt: bool = True  # guaranteed tiers take devices from lower tiers


class Singularity(BasePolicy):
    name = "singularity"

    def __init__(self, cfg: SingularityConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or SingularityConfig()
        self.queue = TieredFairQueue(self.cfg.las_threshold_device_s, self.cfg.project_weights, self.cfg.fair_share)
        self.shrunk: dict[str, None] = {}
        self.sharable: dict[int, dict[str, None]] = {}
        self.guests: dict[str, None] = {}

    # ---- indexes ------------------------------------------------------------------------------------
    def on_rebuild(self, now: float) -> None:
        st = self.st
        assert st is not None
        self.queue = TieredFairQueue(self.cfg.las_threshold_device_s, self.cfg.project_weights, self.cfg.fair_share)
        self.shrunk, self.sharable, self.guests = {}, {}, {}
        for rec in st.pending.values():
            self.queue.add(rec)
        for rec in st.running.values():
            self.on_changed(rec)
            if rec.shared:
                self.guests[rec.id] = None  # after a rebuild the guest/host roles are unknown: both may move

    def on_pending(self, rec: JobRec, now: float) -> None:
        self.queue.add(rec)

    def on_gone(self, rec: JobRec, now: float) -> None:
        self.queue.remove(rec)
        self._unindex(rec)

    def _unindex(self, rec: JobRec) -> None:
        self.shrunk.pop(rec.id, None)
        self.guests.pop(rec.id, None)
        s = self.sharable.get(rec.W)
        if s is not None:
            s.pop(rec.id, None)

    def on_changed(self, rec: JobRec) -> None:
        guest = rec.id in self.guests
        self._unindex(rec)
        if not rec.running:
            return
        if rec.shared:
            if guest:
                self.guests[rec.id] = None
            return
        if len(rec.devices) < rec.hi:
            self.shrunk[rec.id] = None
        elif rec.tier == 0 and len(rec.devices) == rec.W:
            self.sharable.setdefault(rec.W, {})[rec.id] = None

    # ---- the decision -------------------------------------------------------------------------------
    def _candidates(self, new: list[JobRec], freed: bool) -> Iterator[JobRec]:
        st = self.st
        assert st is not None
        if not freed:
            yield from sorted(new, key=lambda r: (-r.tier, r.seq))
            return
        for tier in (2, 1, 0):
            yield from self.queue.iter_tier(tier, st.usage)

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        cfg = self.cfg
        failed: dict[tuple[int, tuple[str, ...]], int] = {}  # (tier, clusters) → smallest size that failed
        wake: list[float] = []
        for rec in self._candidates(new, freed):
            if rec.id not in st.pending:
                continue
            lower_busy = sum(st.tier_devices[: rec.tier]) > 0
            if st.free_total == 0 and not lower_busy and not (cfg.time_slice and rec.tier == 0):
                if freed:
                    break  # tiers come in descending order: nothing below can do better
                continue
            clusters = candidate_clusters(st, rec)
            memo = (rec.tier, tuple(clusters))
            smallest = min(useful_sizes(rec.W, max(rec.lo, 1), rec.hi) or [rec.W])
            if failed.get(memo, 1 << 30) <= smallest and not (cfg.time_slice and rec.tier == 0):
                continue
            if not self._try(rec, clusters, now, wake):
                failed[memo] = min(failed.get(memo, 1 << 30), smallest)
        if cfg.grow:
            grow(self, now)
        if cfg.time_slice:
            unshare(self, now)
        if wake:
            self._wakeup = min(wake)

    def _try(self, rec: JobRec, clusters: list[str], now: float, wake: list[float]) -> bool:
        st = self.st
        assert st is not None
        cfg = self.cfg
        devs = place(st, rec, rec.hi)
        if devs is not None:
            self.start(rec, devs, now)
            return True
        if cfg.preempt and rec.tier > 0 and within_quota(st, rec, cfg.quotas):
            tier = rec.tier
            out = make_room(
                st, clusters, rec.hi, now,
                eligible=lambda j: j.tier < tier,
                order=lambda j: (float(j.tier), -j.last_change),
                min_run_s=cfg.min_run_s, shrink=cfg.shrink, below_tier=tier,
            )
            if out.plan is not None:
                for victim, keep in out.plan.shrinks:
                    self.move(victim, keep, now, kind=ActionKind.RESIZE,
                              reason=f"shrink {len(victim.devices)}->{len(keep)} for {rec.id}")
                for victim in out.plan.victims:
                    self.preempt(victim, now, reason=f"make room for {rec.id}")
                devs = place(st, rec, rec.hi)
                if devs is not None:
                    self.start(rec, devs, now, reason="after preemption")
                    return True
            elif out.wake is not None:
                wake.append(out.wake)
        lo = max(rec.lo, math.ceil(rec.W * cfg.elastic_start_fraction))
        for size in useful_sizes(rec.W, lo, rec.hi - 1) if st.free_total else []:
            devs = place(st, rec, size)
            if devs is not None:
                self.start(rec, devs, now, reason=f"elastic start on {size}")
                return True
        if cfg.defrag and st.free_total >= rec.hi:
            for c in clusters:
                devs = defragment(self, rec, rec.hi, c, now, max_moves=cfg.max_migrations,
                                  min_run_s=cfg.min_run_s)
                if devs is not None:
                    self.start(rec, devs, now, reason="after defragmentation")
                    return True
        if cfg.time_slice and rec.tier == 0:
            host = find_host(self, rec, now)
            if host is not None:
                self.share(rec, host, now)
                self.guests[rec.id] = None
                return True
        return False
