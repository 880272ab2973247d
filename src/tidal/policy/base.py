"""The policy interface and what every policy shares: event intake and action bookkeeping.

``decide(view, events, now) -> list[Action]`` is the whole interface. A policy keeps its indexes
(:class:`SchedState`) between calls and updates them from the events and from its own actions, so that a
decision after one event is cheap; it rebuilds them from the view on the first call, when the view's
generation changes, or after an ``action_failed`` event.
"""

from __future__ import annotations

import abc
import contextlib
import gc
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from tidal.core import Action, ActionKind, ClusterView, DeviceRef, Event, EventKind, JobView, rank_map
from tidal.policy.reasons import Need, Reason, explain, whole
from tidal.policy.state import JobRec, SchedState

_GONE = frozenset({EventKind.JOB_FINISHED, EventKind.JOB_FAILED, EventKind.JOB_CANCELLED, EventKind.JOB_HELD})


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Building the indexes allocates a record per job, all of them kept: a cyclic-garbage collection in
    the middle could free nothing and would only walk the heap (≈ 0.3 s of a 50,000-job rebuild)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Policy(Protocol):
    name: str

    @property
    def grows(self) -> bool:
        """Whether ``decide`` may enlarge running jobs into idle devices when no job waits. A caller that
        skips decisions while nothing waits (the live reconcile loop) must still call it then."""
        ...

    def decide(self, view: ClusterView, events: Sequence[Event], now: float) -> list[Action]: ...

    def next_wakeup(self, now: float) -> float | None:
        """When the policy wants to be called again without an event (e.g. a queue demotion)."""
        ...

    def reasons(self) -> Mapping[str, Reason]:
        """Why each job that the last ``decide`` left waiting waits (computed when asked: the simulator
        never asks)."""
        ...


class BasePolicy(abc.ABC):
    name = "base"
    tierless = False  # baselines that know nothing of tiers

    def __init__(self) -> None:
        self.st: SchedState | None = None
        self._generation: int | None = None
        self._n_actions = 0
        self._cause: str | None = None
        self._out: list[Action] = []
        self._wakeup: float | None = None
        self._view: ClusterView | None = None

    # ---- the interface ----------------------------------------------------------------------------
    def decide(self, view: ClusterView, events: Sequence[Event], now: float) -> list[Action]:
        self._cause = events[-1].id if events else None
        self._out = []
        self._wakeup = None
        self._view = view
        if (
            self.st is None
            or view.generation != self._generation
            or any(e.kind is EventKind.ACTION_FAILED for e in events)
        ):
            with _collector_paused():
                self.st = SchedState(view, tierless=self.tierless)
                self._generation = view.generation
                self.on_rebuild(now)
            new = list(self.st.pending.values())
            freed = True
        else:
            new, freed = self._intake(view, events, now)
            # Drains come with the view, not as events: a node undrained frees its idle devices.
            freed = self.st.set_drained(view.drained) or freed
        if view.drained:
            self.on_drained(view.drained)
        self.schedule(now, new, freed)
        return self._out

    def next_wakeup(self, now: float) -> float | None:
        return self._wakeup

    @property
    def grows(self) -> bool:
        return False

    def reasons(self) -> Mapping[str, Reason]:
        if self._view is None:
            return {}
        return explain(self._view, self._out, self.start_size, over_quota=self.over_quota)

    # ---- why a job waits: how few devices it starts on, its project's quota -------------------------
    def start_size(self, job: JobView) -> Need:
        """The fewest devices the policy starts ``job`` on: by default all of them."""
        return whole(job)

    def over_quota(self, job: JobView) -> Reason | None:
        """Why ``job``'s project's quota keeps it waiting, if it does (by default no policy has quotas)."""
        return None

    # ---- hooks for the concrete policies (all but schedule optional: by default they do nothing) -----
    def on_rebuild(self, now: float) -> None:  # noqa: B027
        """Index every job of the freshly built state (pending queues, running order)."""

    def on_pending(self, rec: JobRec, now: float) -> None:  # noqa: B027
        """A job became pending (arrival, release of a hold, rebuild)."""

    def on_gone(self, rec: JobRec, now: float) -> None:  # noqa: B027
        """A job left the pending queue or the cluster (finished, failed, cancelled, held)."""

    def on_changed(self, rec: JobRec) -> None:  # noqa: B027
        """``rec``'s devices changed (started, shared, preempted, moved, resized)."""

    def on_drained(self, nodes: frozenset[str]) -> None:  # noqa: B027
        """``nodes`` are drained (the indexes hide them already): forget plans that count on them."""

    @abc.abstractmethod
    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        """Decide for ``new`` (jobs that became pending) and, if ``freed``, for what devices freed allow."""

    # ---- intake -------------------------------------------------------------------------------------
    def _intake(self, view: ClusterView, events: Sequence[Event], now: float) -> tuple[list[JobRec], bool]:
        st = self.st
        assert st is not None
        new: list[JobRec] = []
        freed = False
        for e in events:
            k = e.kind
            if k is EventKind.JOB_SUBMITTED or k is EventKind.JOB_RELEASED:
                assert e.job_id is not None
                jv = view.jobs[e.job_id]
                if e.job_id in st.jobs:  # duplicate delivery: idempotent
                    continue
                rec = st.add_pending(jv)
                self.on_pending(rec, now)
                new.append(rec)
            elif k in _GONE:
                assert e.job_id is not None
                rec0 = st.jobs.get(e.job_id)
                if rec0 is None:
                    continue
                was_running = rec0.running
                sharers = self._sharers(rec0)
                self.on_gone(rec0, now)
                st.forget(e.job_id)
                for h in sharers:
                    h.shared = any(st.load[d.node][d.index] > 1 for d in h.devices)
                    self.on_changed(h)
                freed = freed or was_running
            elif k is EventKind.NODE_DOWN and e.node:
                st.node_failed(e.node)
            elif k is EventKind.NODE_UP and e.node:
                st.node_back(e.node)
                freed = True
            elif k is EventKind.TICK:
                freed = True
        return new, freed

    # ---- actions: each updates the indexes as if it succeeded -------------------------------------------
    def _emit(self, kind: ActionKind, rec: JobRec, devices: list[DeviceRef], *, kill: bool = False,
              reason: str = "") -> Action:
        self._n_actions += 1
        a = Action(
            id=f"{self.name}-{self._n_actions}",
            kind=kind,
            job_id=rec.id,
            placement=rank_map(tuple(devices), rec.W) if devices else (),
            cause=self._cause,
            kill=kill,
            reason=reason,
        )
        self._out.append(a)
        return a

    def start(self, rec: JobRec, devices: list[DeviceRef], now: float, reason: str = "") -> None:
        """Place a new job, or resume a preempted one, on ``devices``."""
        st = self.st
        assert st is not None
        kind = ActionKind.RESUME if rec.preemptions or rec.attained > 0 else ActionKind.PLACE
        st.allocate(rec, devices, now=now)
        rec.last_change = now
        rec.last_cluster = st.node_cluster[devices[0].node]
        self.on_gone(rec, now)  # leaves the pending queue
        self.on_changed(rec)
        self._emit(kind, rec, devices, reason=reason)

    def share(self, rec: JobRec, host: JobRec, now: float) -> None:
        """Time-slice ``rec`` on ``host``'s devices (Gandiva's suspend/resume sharing)."""
        st = self.st
        assert st is not None
        devices = list(host.devices)
        st.allocate(rec, devices, now=now)
        rec.shared = host.shared = True
        rec.last_change = now
        self.on_gone(rec, now)
        self.on_changed(rec)
        self.on_changed(host)
        self._emit(ActionKind.TIME_SLICE, rec, devices, reason=f"share with {host.id}")

    def preempt(self, rec: JobRec, now: float, *, kill: bool = False, reason: str = "") -> None:
        st = self.st
        assert st is not None
        hosts = self._sharers(rec)
        st.release(rec, list(rec.devices), now=now)
        for h in hosts:
            h.shared = any(st.load[d.node][d.index] > 1 for d in h.devices)
        rec.preemptions += 1
        st.requeue(rec)
        for h in hosts:
            self.on_changed(h)
        self.on_changed(rec)
        self._emit(ActionKind.PREEMPT, rec, [], kill=kill, reason=reason)
        self.on_pending(rec, now)

    def move(self, rec: JobRec, devices: list[DeviceRef], now: float, *, kind: ActionKind,
             reason: str = "") -> None:
        """Migrate or resize ``rec`` onto ``devices`` (its old devices are released first)."""
        st = self.st
        assert st is not None
        hosts = self._sharers(rec)
        st.settle(rec, now)
        old = list(rec.devices)
        st.release(rec, old, now=now)
        for h in hosts:
            h.shared = any(st.load[d.node][d.index] > 1 for d in h.devices)
        st.allocate(rec, devices, now=now)
        rec.shared = any(st.load[d.node][d.index] > 1 for d in devices)
        rec.last_change = now
        rec.moves += 1
        rec.last_cluster = st.node_cluster[devices[0].node]
        for h in hosts:
            self.on_changed(h)
        self.on_changed(rec)
        self._emit(kind, rec, devices, reason=reason)

    def _sharers(self, rec: JobRec) -> list[JobRec]:
        if not rec.shared:
            return []
        st = self.st
        assert st is not None
        devs = set(rec.devices)
        out = []
        for node in {d.node for d in devs}:
            for jid in st.node_jobs[node]:
                other = st.jobs[jid]
                if other is not rec and other.shared and devs.intersection(other.devices):
                    out.append(other)
        return out
