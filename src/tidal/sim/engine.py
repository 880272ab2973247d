"""The discrete-event engine: a virtual clock, a heap of timed events, and the policy in the loop.

At each instant the engine gathers every event due (finishes first, then arrivals and wake-ups), calls
``policy.decide(view, events, now)`` once, and applies the actions. Jobs replay the trace rigidly: a job
of W ranks needs ``duration`` seconds at full size; on D < W devices it progresses at 1/ceil(W/D) times
the time-slicing efficiency, and a checkpoint, restore, migration or resize pauses it for what the cost
model says. A job's finish time is recomputed only when its rate changes (a version number retires stale
finish events), so the work per event is O(devices touched), never O(jobs).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from tidal.core import (
    Action,
    ActionKind,
    ClusterView,
    DeviceRef,
    Event,
    EventKind,
    JobState,
    JobView,
    Links,
    Topology,
    advance,
)
from tidal.errors import SimulationError
from tidal.policy.admission import Admission
from tidal.policy.base import Policy
from tidal.policy.sla_admission import SlaAdmission
from tidal.sim.cost import CostModel
from tidal.sim.trace import TraceJob

S = JobState
_FINISH, _PAUSE_END, _ARRIVE, _WAKE = 0, 1, 2, 3


class SimJob:
    __slots__ = (
        "W", "attained", "deferred_s", "devices", "duration", "finish", "first_start", "has_ckpt", "home", "id",
        "killed_restart", "last_t", "lost_device_s", "mem", "migrations", "owner", "pause_until", "preemptions",
        "project", "queue_s", "rate", "refused", "remaining", "requested", "resizes", "started_at", "state", "submit",
        "tier", "version", "wait_since",
    )

    def __init__(self, tj: TraceJob, home: str | None, mem_gb: float = 6.2) -> None:
        self.id = tj.id
        self.mem = mem_gb  # a rank's image, GB
        self.submit = tj.submit
        self.duration = tj.duration
        self.W = tj.gpus
        assert tj.tier is not None
        self.tier = tj.tier
        self.requested = tj.tier  # the tier asked for; ``tier`` is the one admitted
        self.project = tj.project
        self.owner = tj.user or ""  # a trace without users: every job one user's
        self.home = home
        self.state = S.PENDING
        self.remaining = tj.duration
        self.rate = 0.0
        self.last_t = tj.submit
        self.devices: tuple[DeviceRef, ...] = ()
        self.pause_until = 0.0
        self.version = 0
        self.first_start: float | None = None
        self.finish: float | None = None
        self.preemptions = self.migrations = self.resizes = 0
        self.lost_device_s = 0.0
        self.has_ckpt = False
        self.killed_restart = False
        self.queue_s = 0.0
        self.wait_since = tj.submit
        self.started_at: float | None = None
        self.attained = 0.0
        self.refused = ""  # why admission refused it (it never ran)
        self.deferred_s: float | None = None  # deferred by SLA admission: from its submission to its release


@dataclasses.dataclass
class SimResult:
    policy: str
    jobs: list[SimJob]
    capacity: int
    window: tuple[float, float]
    good_device_s: float  # useful device-seconds within the window
    alloc_device_s: float  # device-seconds held within the window
    series_t: list[float]
    series_good: list[float]  # per bin: mean useful devices busy ÷ capacity
    series_alloc: list[float]
    decisions: int
    actions: dict[str, int]
    live_executable_actions: int
    sim_only_actions: int
    idle_waiting_device_s: float = 0.0  # devices idle while at least one job waited, over the whole run
    span_s: float = 0.0  # first arrival to last finish


class Simulator:
    def __init__(
        self,
        topology: Topology,
        jobs: Sequence[TraceJob],
        policy: Policy,
        *,
        cost: CostModel | None = None,
        pinned: bool = False,
        oracle: bool = True,
        bins: int = 200,
        log: Callable[[dict[str, Any]], None] | None = None,
        admission: Admission | None = None,
        sla_admission: SlaAdmission | None = None,
        device_caps: Mapping[str, int] | None = None,
        project_caps: Mapping[str, int] | None = None,
    ) -> None:
        """``admission``: premium and standard jobs over their project's quota run as basic.
        ``sla_admission``: guaranteed jobs whose SLA the load makes unreachable are demoted, refused, or
        deferred (they join the policy's queue when admitted work has finished enough to meet their target).
        ``device_caps``: the most devices each user may hold (the view's, as the live control plane gives it);
        ``project_caps``: the most devices each project's jobs may hold together."""
        self.topo = topology
        self.policy = policy
        self.admission = admission
        self.sla_admission = sla_admission
        if sla_admission is not None:
            sla_admission.done = self._work_done  # its backlog is what is left of the admitted jobs' work
        self.cost = cost or CostModel()
        self.oracle = oracle
        self.log = log
        self.node_cluster = {n.name: c.name for c in topology.clusters() for n in c.nodes}
        self.cluster_region = {c.name: topology.region_of(c.name) for c in topology.clusters()}
        self.capacity = topology.devices
        self.trace = list(jobs)
        self.jobs: dict[str, SimJob] = {}
        self.live: dict[str, SimJob] = {}  # submitted and not finished: what the view shows
        # The policy weighs a move to another cluster by its cost model's links (policy/spill.py).
        links = Links(node_gbps=self.cost.net_gbps_per_node, region_gbps=self.cost.cross_region_gbps)
        self.view = ClusterView(topology, MappingProxyType(_LiveViews(self.live, self._job_view)), links=links,
                                device_caps=device_caps or {}, project_caps=project_caps or {})
        self.device_jobs: dict[DeviceRef, list[SimJob]] = {}
        self.busy_until: dict[DeviceRef, float] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._eid = 0
        self.g_rate = 0.0
        self.a_rate = 0
        self.t = 0.0
        self.window = (self.trace[0].submit, self.trace[-1].submit) if self.trace else (0.0, 0.0)
        span = max(self.window[1] - self.window[0], 1.0)
        self.bin_w = span / bins
        # The series keeps at most this many bins: a run that goes on far past the window (a drain, or
        # a policy's far wake-up) merges bins pairwise rather than growing the list without bound.
        self.max_bins = 4 * bins
        self.bins_good: list[float] = []
        self.bins_alloc: list[float] = []
        self.good = 0.0
        self.alloc = 0.0
        self.waiting = 0  # jobs submitted and waiting for devices (pending or preempted)
        self.idle_waiting = 0.0
        self.decisions = 0
        self.action_counts: dict[ActionKind, int] = {}
        self.live_n = 0
        self.sim_only_n = 0
        self.done = 0
        self.pinned = pinned
        self._wakes: set[float] = set()

    # ---- clock and accounting ------------------------------------------------------------------------
    def _push(self, t: float, kind: int, job_id: str, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, job_id, version))

    def _advance(self, t: float) -> None:
        t0 = self.t
        if t <= t0:
            return
        w0, w1 = self.window
        g_rate, a_rate = self.g_rate, self.a_rate
        if self.waiting:
            self.idle_waiting += (self.capacity - a_rate) * (t - t0)
        lo, hi = max(t0, w0), min(t, w1)
        if hi > lo:
            self.good += g_rate * (hi - lo)
            self.alloc += a_rate * (hi - lo)
        # Time series over the whole run (bins of the window's width / bins), for the plots.
        bin_w, bins_good, bins_alloc = self.bin_w, self.bins_good, self.bins_alloc
        a = t0
        while a < t:
            i = int((a - w0) // bin_w)
            b = w0 + (i + 1) * bin_w
            if b <= a:  # float rounding at a bin boundary
                i += 1
                b += bin_w
            if i >= self.max_bins:
                self._coarsen(i)
                bin_w, bins_good, bins_alloc = self.bin_w, self.bins_good, self.bins_alloc
                continue
            if t < b:
                b = t
            if i >= 0:
                while len(bins_good) <= i:
                    bins_good.append(0.0)
                    bins_alloc.append(0.0)
                bins_good[i] += g_rate * (b - a)
                bins_alloc[i] += a_rate * (b - a)
            a = b
        self.t = t

    def _coarsen(self, i: int) -> None:
        """Double the bin width (merging bins pairwise) until bin ``i`` of the current width fits."""
        while i >= self.max_bins:
            g, a = self.bins_good, self.bins_alloc
            self.bins_good = [sum(g[k:k + 2]) for k in range(0, len(g), 2)]
            self.bins_alloc = [sum(a[k:k + 2]) for k in range(0, len(a), 2)]
            self.bin_w *= 2
            i //= 2

    def _event(self, kind: EventKind, job: str | None, cause: str | None = None, detail: str = "") -> Event:
        self._eid += 1
        e = Event(f"e{self._eid}", self.t, kind, job_id=job, cause=cause, detail=detail)
        if self.log is not None:
            self.log(e.to_record())
        return e

    def _job_view(self, j: SimJob) -> JobView:
        return JobView(
            id=j.id, ranks=j.W, tier=j.tier, submitted_at=j.submit, state=j.state, project=j.project, owner=j.owner,
            min_devices=1, max_devices=j.W,
            placement=tuple(j.devices[r * len(j.devices) // j.W] for r in range(j.W)) if j.devices else (),
            started_at=j.started_at, attained_device_s=j.attained, home_cluster=j.home,
            image_gb=j.W * self.cost.image_gb(j.mem),
            duration_hint=j.duration if self.oracle else None,
            remaining_hint=j.remaining if self.oracle else None,
        )

    def _work_done(self, jid: str) -> float:
        """Seconds of its work at full size that job ``jid`` has done by now."""
        j = self.jobs[jid]
        return j.duration - max(0.0, j.remaining - j.rate * (self.t - j.last_t))

    def _sharers(self, j: SimJob) -> int:
        device_jobs = self.device_jobs
        most = 1
        for d in j.devices:
            k = len(device_jobs[d])
            if k > most:
                most = k
        return most

    def _update_rate(self, j: SimJob) -> None:
        """Fold progress up to now, then set the job's rate from its devices and pause, and re-arm
        its finish event."""
        now = self.t
        rate = j.rate
        j.remaining = max(0.0, j.remaining - rate * (now - j.last_t))
        j.last_t = now
        new = 0.0
        devices = j.devices
        if devices and now >= j.pause_until and j.state is S.RUNNING:
            new = self.cost.rate(j.W, len(devices), self._sharers(j))
        self.g_rate += j.W * (new - rate)
        j.rate = new
        j.version += 1
        if new > 0:
            self._push(now + j.remaining / new, _FINISH, j.id, j.version)
        elif devices and j.pause_until > now:
            self._push(j.pause_until, _PAUSE_END, j.id, j.version)

    def _hold(self, j: SimJob, devices: tuple[DeviceRef, ...]) -> list[SimJob]:
        touched: list[SimJob] = []
        device_jobs = self.device_jobs
        taken = 0
        for d in devices:
            lst = device_jobs.get(d)
            if lst is None:
                lst = device_jobs[d] = []
            if not lst:
                taken += 1
            else:
                touched.extend(lst)
            lst.append(j)
        self.a_rate += taken
        j.devices = devices
        return touched

    def _drop(self, j: SimJob) -> list[SimJob]:
        touched: list[SimJob] = []
        device_jobs = self.device_jobs
        freed = 0
        for d in j.devices:
            lst = device_jobs[d]
            lst.remove(j)
            if not lst:
                freed += 1
            else:
                touched.extend(lst)
        self.a_rate -= freed
        j.devices = ()
        return touched

    def _fold_service(self, j: SimJob) -> None:
        if j.started_at is not None and j.devices:
            j.attained += len(j.devices) * (self.t - j.started_at)

    def _nodes(self, devices: Sequence[DeviceRef]) -> int:
        return len({d.node for d in devices})

    # ---- actions ------------------------------------------------------------------------------------
    def _apply(self, a: Action) -> None:
        j = self.jobs[a.job_id]
        now = self.t
        k = a.kind
        counts = self.action_counts
        counts[k] = counts.get(k, 0) + 1
        if a.live_executable:
            self.live_n += 1
        else:
            self.sim_only_n += 1
        if self.log is not None:
            rec = a.to_record()
            rec["time"] = now
            self.log(rec)
        cost = self.cost
        busy_until = self.busy_until
        if k is ActionKind.PLACE or k is ActionKind.RESUME or k is ActionKind.TIME_SLICE:
            devs = a.devices
            self.waiting -= 1
            if j.state is S.PREEMPTED:
                j.state = advance(advance(j.state, S.RESTORING, job=j.id), S.RUNNING, job=j.id)
            else:
                j.state = advance(j.state, S.RUNNING, job=j.id)
            ready = max(now, j.pause_until, *[busy_until.get(d, 0.0) for d in devs])
            if j.has_ckpt and not j.killed_restart:
                pause = cost.restore_s(j.W, len(devs), self._nodes(devs), cross_region=False, mem_gb=j.mem)
            elif j.killed_restart:
                pause = cost.restart_s
            else:
                pause = cost.start_s
            j.killed_restart = False
            j.pause_until = ready + pause
            j.queue_s += now - j.wait_since
            if j.first_start is None:
                j.first_start = now
            j.started_at = now
            touched = self._hold(j, devs)
            self._update_rate(j)
            for o in touched:
                self._update_rate(o)
        elif k is ActionKind.PREEMPT:
            self._update_rate_fold(j)
            self._fold_service(j)
            old = j.devices
            j.preemptions += 1
            if a.kill:
                done = j.duration - j.remaining
                interval = cost.user_checkpoint_s
                kept = math.floor(done / interval) * interval if interval > 0 else 0.0
                lost = done - kept
                j.remaining += lost
                j.lost_device_s += lost * j.W
                self._unaccount(lost * j.W)
                j.killed_restart = kept > 0
                j.state = advance(j.state, S.PENDING, job=j.id)
                j.pause_until = now
            else:
                ck = cost.checkpoint_s(j.W, len(old), self._nodes(old), j.mem)
                for d in old:
                    busy_until[d] = now + ck
                # The devices stay busy until the dump is written; they count as allocated to the job
                # placed on them next (from its placement), so nothing is added here: no double count.
                j.state = advance(advance(j.state, S.CHECKPOINTING, job=j.id), S.PREEMPTED, job=j.id)
                j.has_ckpt = True
                j.pause_until = now + ck
            touched = self._drop(j)
            j.wait_since = now
            self.waiting += 1
            self._update_rate(j)
            for o in touched:
                self._update_rate(o)
        elif k is ActionKind.MIGRATE or k is ActionKind.RESIZE:
            self._update_rate_fold(j)
            self._fold_service(j)
            old = j.devices
            new = a.devices
            on = {d.node for d in old}
            if len(on) == 1 and on == {d.node for d in new}:  # restored from the images dumped on its node
                ck, rs = cost.local_move_s(j.W, len(old), len(new), j.mem)
            else:
                ck = cost.checkpoint_s(j.W, len(old), self._nodes(old), j.mem)
                cross = {self.cluster_region[self.node_cluster[d.node]] for d in old} != {
                    self.cluster_region[self.node_cluster[d.node]] for d in new}
                rs = cost.restore_s(j.W, len(new), self._nodes(new), cross_region=cross, mem_gb=j.mem)
            for d in old:
                busy_until[d] = max(busy_until.get(d, 0.0), now + ck)
            mid = S.MIGRATING if k is ActionKind.MIGRATE else S.RESIZING
            j.state = advance(advance(advance(advance(j.state, S.CHECKPOINTING, job=j.id), mid, job=j.id),
                                      S.RESTORING, job=j.id), S.RUNNING, job=j.id)
            if k is ActionKind.MIGRATE:
                j.migrations += 1
            else:
                j.resizes += 1
            j.has_ckpt = True
            touched = self._drop(j)
            busy_new = max([now + ck] + [busy_until.get(d, 0.0) for d in new if d not in old])
            j.pause_until = busy_new + rs
            j.started_at = now
            touched += self._hold(j, new)
            self._update_rate(j)
            for o in touched:
                if o is not j:
                    self._update_rate(o)

    def _unaccount(self, device_s: float) -> None:
        # Work that will be redone was not useful: take it back out of the goodput (from the window
        # total if we are still in the window, and from the current bin of the series).
        if self.t <= self.window[1]:
            self.good -= device_s
        i = int((self.t - self.window[0]) // self.bin_w)
        if 0 <= i < len(self.bins_good):
            self.bins_good[i] -= device_s

    def _update_rate_fold(self, j: SimJob) -> None:
        j.remaining = max(0.0, j.remaining - j.rate * (self.t - j.last_t))
        j.last_t = self.t

    def _enter(self, j: SimJob, detail: str) -> Event:
        """The job joins the policy's queue (submitted, or released by SLA admission)."""
        self.live[j.id] = j
        self.waiting += 1
        if self.admission is not None:
            adm = self.admission.admit(j.id, j.project, j.tier, j.W)
            if adm.demoted:
                j.tier = adm.tier
                detail = f"admitted as {adm.tier.value}: {adm.reason}"
        return self._event(EventKind.JOB_SUBMITTED, j.id, detail=detail)

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None) -> SimResult:
        for tj in self.trace:
            home = tj.project if self.pinned else None
            self._push(tj.submit, _ARRIVE, tj.id)
            self.jobs[tj.id] = SimJob(tj, home, self.cost.mem_gb(tj.id, tj.mem_gb))
        if self.trace:
            self.t = self.trace[0].submit
        total = len(self.trace)
        while self.heap:
            if self.done == total:
                break  # only wake-ups are left: nothing more can happen
            now = self.heap[0][0]
            self._advance(now)
            events: list[Event] = []
            while self.heap and self.heap[0][0] <= now:
                _, kind, _, jid, ver = heapq.heappop(self.heap)
                if kind == _ARRIVE:
                    j = self.jobs[jid]
                    detail = ""
                    if self.sla_admission is not None:
                        sla = self.sla_admission.admit(jid, j.tier, j.W, j.duration if self.oracle else None)
                        if sla.outcome == "refused":
                            j.refused = sla.reason
                            j.state = advance(j.state, S.CANCELLED, job=j.id)
                            self.done += 1
                            self._event(EventKind.JOB_CANCELLED, jid, detail=sla.reason)  # logged only
                            continue
                        if sla.outcome == "deferred":
                            # Not in the policy's queue until released (below, as admitted work finishes);
                            # its queueing time runs from its submission all the same.
                            j.deferred_s = 0.0
                            if self.log is not None:
                                self.log({"type": "event", "time": now, "kind": "job_deferred", "job": jid,
                                          "detail": sla.reason})
                            continue
                        if sla.outcome == "demoted":
                            j.tier = sla.tier
                            detail = sla.reason
                    events.append(self._enter(j, detail))
                elif kind == _WAKE:
                    self._wakes.discard(now)
                    events.append(self._event(EventKind.TICK, None))
                else:
                    j = self.jobs[jid]
                    if ver != j.version:
                        continue
                    if kind == _PAUSE_END:
                        self._update_rate(j)
                        continue
                    # Finished.
                    j.remaining = 0.0
                    j.last_t = now
                    self.g_rate -= j.W * j.rate
                    j.rate = 0.0
                    self._fold_service(j)
                    touched = self._drop(j)
                    j.state = advance(j.state, S.SUCCEEDED, job=j.id)
                    j.finish = now
                    j.version += 1
                    for o in touched:
                        self._update_rate(o)
                    del self.live[jid]
                    if self.admission is not None:
                        self.admission.finished(jid)
                    self.done += 1
                    events.append(self._event(EventKind.JOB_FINISHED, jid))
                    if self.sla_admission is not None:
                        self.sla_admission.finished(jid)
                        for rel in self.sla_admission.release():
                            d = self.jobs[rel.job_id]
                            d.deferred_s = now - d.submit
                            events.append(self._enter(d, rel.reason))
            if not events:
                continue
            self.decisions += 1
            actions = self.policy.decide(self.view, events, now)
            for a in actions:
                self._apply(a)
            wake = self.policy.next_wakeup(now)
            if wake is not None and wake > now and wake not in self._wakes:
                self._wakes.add(wake)
                self._push(wake, _WAKE, "")
            if progress is not None:
                progress(self.done)
        unfinished = [j for j in self.jobs.values() if j.finish is None and not j.refused]
        if unfinished and total:
            raise SimulationError(
                f"{self.policy.name}: {len(unfinished)} jobs never finished "
                f"(e.g. {unfinished[0].id}, {unfinished[0].state.value}): the policy stopped starting them",
                policy=self.policy.name, unfinished=len(unfinished),
                hint="a bug of the policy: it must start every job that fits the cluster once nothing else runs; "
                     "narrow the trace down (--limit) to find the first job it leaves waiting")
        w = self.bin_w
        return SimResult(
            policy=self.policy.name,
            jobs=list(self.jobs.values()),
            capacity=self.capacity,
            window=self.window,
            good_device_s=self.good,
            alloc_device_s=self.alloc,
            series_t=[self.window[0] + (i + 0.5) * w for i in range(len(self.bins_good))],
            series_good=[g / (w * self.capacity) for g in self.bins_good],
            series_alloc=[a / (w * self.capacity) for a in self.bins_alloc],
            decisions=self.decisions,
            idle_waiting_device_s=self.idle_waiting,
            span_s=self.t - (self.trace[0].submit if self.trace else 0.0),
            actions={k.value: n for k, n in self.action_counts.items()},
            live_executable_actions=self.live_n,
            sim_only_actions=self.sim_only_n,
        )


class _LiveViews(Mapping[str, JobView]):
    """The jobs of the view, each built from the simulated job when the policy reads it (it reads a job
    on its arrival and when it rebuilds): no view object is made per action."""

    def __init__(self, live: dict[str, SimJob], make: Callable[[SimJob], JobView]) -> None:
        self._live = live
        self._make = make

    def __getitem__(self, job_id: str) -> JobView:
        return self._make(self._live[job_id])

    def __iter__(self) -> Iterator[str]:
        return iter(self._live)

    def __len__(self) -> int:
        return len(self._live)
