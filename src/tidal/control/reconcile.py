"""The reconcile loop: compare desired and observed state and act.

Each pass, in one transaction: expire nodes whose lease ran out (their jobs are requeued; a node that keeps
losing it is drained), undrain the nodes healthy for long enough (:mod:`tidal.control.drains`), take due
periodic checkpoints, then snapshot the cluster into a :class:`ClusterView`, ask the policy for actions
and turn the ones still valid into agent actions (never onto a drained node). The loop wakes on every commit
(a submission, a result) and at least every ``interval`` seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import agents, deferral, drains, jobs, linkrates
from tidal.control.checkpointing import checkpoint
from tidal.control.history import record
from tidal.control.launch import start
from tidal.control.reasons import set_reason
from tidal.control.rendezvous import RendezvousHost
from tidal.control.requests import gpu_misfits, resize_to
from tidal.control.store.db import Database, lost_connection
from tidal.control.store.models import JobRow, NodeRow
from tidal.core import (
    Action,
    ActionKind,
    Cluster,
    ClusterView,
    DeviceRef,
    JobSpec,
    JobState,
    JobView,
    Links,
    Node,
    Region,
    Tier,
    Topology,
)
from tidal.core.clock import SYSTEM, Clock
from tidal.errors import TidalError, Unavailable
from tidal.policy import gpufit
from tidal.policy import reasons as policy_reasons
from tidal.policy.base import Policy
from tidal.policy.sla_admission import run_time_left

log = logging.getLogger(__name__)
S = JobState

#: The longest rest between two passes that the time a pass took asks for.
MAX_REST_S = 0.5
#: How often the passes that take no snapshot (nothing waits) forget the specs of jobs that ended.
PRUNE_EVERY_S = 60.0
LIVE = tuple(st.value for st in (S.PENDING, S.PREEMPTED, *jobs.ACTIVE))


class Reconciler:
    """Runs ``policy`` over the cluster in ``db``. ``clock``: where it reads the time (wall time for
    leases, checkpoint timers and the policy's ``now``; monotonic time for its own pacing); by default the
    database's, the one every transaction of the control plane reads. ``device_caps``: read in each pass's
    transaction, the most devices each user may hold (users not named: no cap); None: no caps.
    ``project_caps``: likewise, the most devices each project's jobs may hold together."""

    def __init__(self, db: Database, policy: Policy, *, interval: float = 0.5,
                 min_gap: float = 0.05, explain_every: float = 0.0, clock: Clock | None = None,
                 links: Links | None = None,
                 device_caps: Callable[[Session], Mapping[str, int]] | None = None,
                 project_caps: Callable[[Session], Mapping[str, int]] | None = None) -> None:
        self.db = db
        self.policy = policy
        self.device_caps = device_caps
        self.project_caps = project_caps
        # The links between clusters and regions the policy weighs moves over, as the settings give them; each
        # pass adds the rates measured between regions (snapshot).
        self.links = links or Links()
        self.clock: Clock = clock or db.info.get("clock", SYSTEM)
        self.interval = interval
        self.min_gap = min_gap
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._run = secrets.token_hex(3)
        self._passes = 0  # policy action ids are unique per process: prefix them
        # A pass that only explains new waiting jobs (the policy could not place them anyway) reads every live
        # job under the writers' lock: at most one every ``explain_every`` seconds, or a burst of submissions
        # to a full cluster would pay that read once per submission.
        self.explain_every = explain_every
        self._explained_at: float | None = None
        # Job → the placement last refused for its GPU memory (see _refuse_unfit).
        self._unfit: dict[str, tuple[DeviceRef, ...]] = {}
        # What a pass's snapshot keeps for the next (specs, waiting jobs' views).
        self._cache = ViewCache()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tidal-reconcile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self.db.changed:
            self.db.changed.notify_all()
        if self._thread:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = self.clock.monotonic()
            try:
                self.once()
            except Unavailable:
                pass  # the database is away (logged where found): the next pass tries again
            except Exception as exc:
                if lost_connection(exc):  # found outside a transaction (the look before one)
                    log.warning("reconcile pass skipped: the database is unavailable")
                else:
                    log.exception("reconcile pass failed")
            # Coalesce bursts (a thousand submissions): a pass reads every live job, so running one per
            # commit would make a burst quadratic. Under load, rest at least as long as the pass took (at
            # most MAX_REST_S): the passes then take at most half of the process's time, the API the rest.
            took = self.clock.monotonic() - t0
            self._stop.wait(max(self.min_gap - took, min(took, MAX_REST_S)))
            with self.db.changed:
                # once() itself commits; wait for a commit by someone else, or the interval.
                seen = self.db.generation

                def moved(seen: int = seen) -> bool:
                    return self.db.generation != seen or self._stop.is_set()

                self.db.changed.wait_for(moved, timeout=self.interval)

    def once(self) -> None:
        host = self.db.info.get("rendezvous")
        if isinstance(host, RendezvousHost):
            host.prepare(self.db)  # before the transaction that may launch a distributed job
        now = self.clock.time()
        # Look first without the writers' lock (SQLite WAL and PostgreSQL give a consistent snapshot):
        # most passes find nothing to do, and holding the lock for their queries would stall the API.
        with self.db.read() as s:
            if not self._anything_to_do(s, now):
                return
        with self.db.tx() as s:
            for node in s.scalars(select(NodeRow).where(NodeRow.up.is_(True), NodeRow.lease_until < now)):
                agents.expire(s, node, "lease expired", lease_lost=True)
            drains.undrain_healed(s, now, f"reconcile-{self._run}")
            for job in self._due(s, now):
                checkpoint(s, job, "periodic", f"timer-{self._run}")
            deferral.release_due(s, f"reconcile-{self._run}")
        self._schedule(now)

    def _anything_to_do(self, s: Session, now: float) -> bool:
        expired = select(NodeRow.name).where(NodeRow.up.is_(True), NodeRow.lease_until < now).limit(1)
        return (s.scalar(expired) is not None or bool(self._due(s, now)) or self._worth_deciding(s)
                or self._explain_due(s) or bool(deferral.due(s)) or drains.any_healed(s, now))

    def _explain_due(self, s: Session) -> bool:
        """Whether a pass should run only to say why new waiting jobs wait (see ``explain_every``)."""
        last = self._explained_at
        if last is not None and self.clock.monotonic() - last < self.explain_every:
            return False
        return _unexplained(s)

    def _due(self, s: Session, now: float) -> list[JobRow]:
        """Running jobs whose periodic checkpoint is due (their specs from the passes' cache: this runs at
        every pass, over every running job)."""
        rows = s.execute(select(JobRow.id, JobRow.last_checkpoint_at, JobRow.started_at).where(
            JobRow.state == S.RUNNING.value, JobRow.op.is_(None))).all()
        specs = self._cache.specs
        if self.clock.monotonic() - self._cache.pruned_at > PRUNE_EVERY_S:  # when no snapshot prunes it
            self._cache.prune(set(s.scalars(select(JobRow.id).where(JobRow.state.in_(LIVE)))),
                              self.clock.monotonic())
        _specs(s, [r.id for r in rows], specs)
        due = []
        for jid, last, started in rows:
            every = specs[jid].checkpoint_every
            if every and now - max(last or 0.0, started or now) >= float(every):
                due.append(jid)
        return [j for j in (s.get(JobRow, jid) for jid in due) if j is not None]

    def _schedule(self, now: float) -> None:
        """Snapshot, decide, then commit. The snapshot is read and the policy decides without the writers'
        lock: with thousands of jobs waiting that is most of a pass, and the API (agents' heartbeats first)
        must not wait for it. Only applying the decisions takes the lock, and each is checked again there
        against the job and the devices as they are then (a job cancelled or moved meanwhile is left alone,
        a device taken meanwhile is not given twice)."""
        with self.db.read() as s:
            if not self._worth_deciding(s) and not self._explain_due(s):
                return
            # A new generation every pass: the live loop hands the policy no event stream, so a stateful
            # policy must rebuild its indexes from the view each time (a stateless one reads the view anyway).
            self._passes += 1
            caps = self.device_caps(s) if self.device_caps is not None else None
            project_caps = self.project_caps(s) if self.project_caps is not None else None
            view, seen = snapshot(s, generation=self._passes, links=self.links, cache=self._cache, device_caps=caps,
                                  project_caps=project_caps)
        self._unfit = {j: p for j, p in self._unfit.items() if j in seen}
        actions = self.policy.decide(view, [], now)
        why = self.policy.reasons()
        with self.db.tx() as s:
            freeing = self._apply(s, actions, view.drained)
            self._explain(s, seen, why, freeing)

    def _apply(self, s: Session, actions: list[Action], drained: frozenset[str]) -> dict[str, int]:
        """Turn the policy's actions that still hold into operations. Returns, per job left waiting for devices
        that preemptions have yet to free, how many."""
        free = jobs.free_devices(s)
        freeing: dict[str, int] = {}  # job → devices of its placement that preemptions have yet to free
        for a in actions:
            job = s.get(JobRow, a.job_id)
            if job is None:
                continue
            # A move or resize may keep some of the job's own devices.
            own = ({(p["node"], int(p["device"])) for p in job.placement}
                   if a.kind in (ActionKind.MIGRATE, ActionKind.RESIZE) else set())
            new = [d for d in a.devices if (d.node, d.index) not in own]
            if drained and any(d.node in drained for d in new):
                log.warning("policy action %s puts job %s on a drained node; not applied", a.id, a.job_id)
                continue
            if a.placement and not all(d.index in free.get(d.node, ()) for d in new):
                # A policy may count on devices that a preemption it just asked for will free (as in the
                # simulator, where preemption is instant). Here they are free only once the checkpoint is
                # committed: a later pass places the job then.
                freeing[a.job_id] = sum(1 for d in new if d.index not in free.get(d.node, ()))
                continue
            cause = f"{a.id}-{self._run}"
            moves = (jobs.state(job) is S.RUNNING and job.op is None
                     and (a.kind is ActionKind.MIGRATE or (a.kind is ActionKind.RESIZE and not job.pinned_devices)))
            if moves and self._refuse_unfit(s, job, a, cause):
                continue
            for d in new:
                free[d.node].remove(d.index)
            try:
                waiting = jobs.state(job) in (S.PENDING, S.PREEMPTED) and not job.held
                if a.kind in (ActionKind.PLACE, ActionKind.RESUME) and waiting:
                    start(s, job, list(a.placement), cause)
                elif (a.kind is ActionKind.PREEMPT and not a.kill and jobs.state(job) is S.RUNNING
                      and job.op is None):
                    checkpoint(s, job, "preempt", cause)
                elif a.kind is ActionKind.MIGRATE and jobs.state(job) is S.RUNNING and job.op is None:
                    job.target = [[d.node, d.index] for d in a.placement]
                    record(s, "migrate", job_id=job.id, cause=cause,
                           detail=f"to {', '.join(dict.fromkeys(d.node for d in a.devices))} by the scheduler: "
                                  f"{a.reason}")
                    checkpoint(s, job, "migrate", cause)
                elif (a.kind is ActionKind.RESIZE and jobs.state(job) is S.RUNNING and job.op is None
                      and not job.pinned_devices):
                    before, after = jobs.device_count(job), len(a.devices)
                    resize_to(s, job, list(a.placement), cause,
                              why=f"from {before} to {after} device(s) by the scheduler: {a.reason}")
                # Time-slicing of different jobs on one device is simulator-only (not LIVE_EXECUTABLE).
            except TidalError as exc:
                log.warning("policy action %s on job %s not applied: %s", a.id, a.job_id, exc)
        return freeing

    def _refuse_unfit(self, s: Session, job: JobRow, a: Action, cause: str) -> bool:
        """Whether the move or resize ``a`` would splice ranks onto a GPU whose memory they do not fit in (or put
        a rank on a GPU too small for it): then it is not applied, and its refusal recorded (once per
        placement: the policy, which does not know GPU memory, may ask for the same every pass)."""
        unfit = gpu_misfits(s, job, list(a.placement))
        if not unfit:
            self._unfit.pop(job.id, None)
            return False
        if self._unfit.get(job.id) != a.placement:
            self._unfit[job.id] = a.placement
            nodes = ", ".join(dict.fromkeys(d.node for d in a.devices))
            what = (f"resize from {jobs.device_count(job)} to {len(a.devices)} device(s)"
                    if a.kind is ActionKind.RESIZE else f"move to {nodes}")
            detail = f"the scheduler's {what} is not applied: {gpufit.describe(job.id, len(a.devices), unfit)}"
            record(s, "placement_refused", job_id=job.id, cause=cause, detail=detail)
            log.info("job %s: %s", job.id, detail)
        return True

    def _explain(self, s: Session, seen: dict[str, Seen], why: Mapping[str, policy_reasons.Reason],
                 freeing: dict[str, int]) -> None:
        """Store why each job still waits: the policy's reason, or the devices it waits to be freed. Only the
        jobs whose reason changed since the snapshot are read again (under the lock: still waiting?)."""
        self._explained_at = self.clock.monotonic()
        cause = f"reconcile-{self._run}"
        changed: dict[str, policy_reasons.Reason] = {}
        for jid, was in seen.items():
            if was.state not in (S.PENDING, S.PREEMPTED):
                continue
            if was.held:
                reason = policy_reasons.held()
            elif jid in freeing:
                reason = policy_reasons.making_room(freeing[jid])
            else:
                reason = why.get(jid) or policy_reasons.queued()
            if (reason.why.value, reason.text) != (was.reason_code, was.reason):
                changed[jid] = reason
        ids = list(changed)
        for k in range(0, len(ids), _SPECS_PER_QUERY):  # the rows to change, a few queries for thousands
            for job in s.scalars(select(JobRow).where(JobRow.id.in_(ids[k:k + _SPECS_PER_QUERY]))):
                was = seen[job.id]
                # Placed, cancelled or held meanwhile: its reason is no longer this pass's to give.
                if jobs.state(job) is was.state and job.held == was.held:
                    set_reason(s, job, changed[job.id], cause)

    def _worth_deciding(self, s: Session) -> bool:
        """Cheap pre-check (it reads only the jobs holding devices): the policy can only act when a job
        waits and either a device is free or a waiting job outranks basic (it may preempt)."""
        waiting = (JobRow.state == S.PENDING.value) | ((JobRow.state == S.PREEMPTED.value) & ~JobRow.held)
        if s.scalar(select(JobRow.id).where(waiting).limit(1)) is None:
            # Nothing waits: only growing a shrunk job into idle devices is left to decide.
            return self.policy.grows and any(jobs.free_devices(s, schedulable=True).values()) and any(
                jobs.device_count(j) < (jobs.spec_of(j).max_devices or j.ranks) and not j.pinned_devices
                for j in s.scalars(select(JobRow).where(JobRow.state == S.RUNNING.value, JobRow.op.is_(None))))
        if any(jobs.free_devices(s, schedulable=True).values()):
            return True
        urgent = waiting & (JobRow.tier != Tier.BASIC.value)
        return s.scalar(select(JobRow.id).where(urgent).limit(1)) is not None


def _unexplained(s: Session) -> bool:
    """Whether a waiting job has no reason yet (new, requeued or released): a pass must say why it waits."""
    waiting = JobRow.state.in_((S.PENDING.value, S.PREEMPTED.value)) & JobRow.reason_code.is_(None)
    return s.scalar(select(JobRow.id).where(waiting).limit(1)) is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """What a pass's snapshot saw of a live job that its reasons depend on."""

    state: JobState
    held: bool
    reason_code: str | None
    reason: str | None


#: The columns of a live job the policy's view is made of (its spec is read once per job: it never changes). A
#: waiting job holds no devices: its placement and target are not read.
_WAITING_COLUMNS = (JobRow.id, JobRow.owner, JobRow.ranks, JobRow.tier, JobRow.submitted_at, JobRow.state,
                    JobRow.held, JobRow.started_at, JobRow.attained_device_s, JobRow.last_cluster,
                    JobRow.pinned_devices, JobRow.progress, JobRow.reason_code, JobRow.reason)
_ACTIVE_COLUMNS = (*_WAITING_COLUMNS, JobRow.op, JobRow.op_purpose, JobRow.placement, JobRow.target)
_SPECS_PER_QUERY = 500  # ids per IN list when reading the specs of new jobs


@dataclasses.dataclass
class ViewCache:
    """What one pass's snapshot keeps for the next (both pruned to the live jobs at each snapshot): each job's
    spec (read once: it never changes), and each waiting job's view with the row it was made from (made
    again only when the row changed). A pass over thousands of waiting jobs so decodes and builds only what
    is new."""

    specs: dict[str, JobSpec] = dataclasses.field(default_factory=dict)
    views: dict[str, tuple[Any, JobView]] = dataclasses.field(default_factory=dict)
    pruned_at: float = 0.0  # monotonic

    def prune(self, live: set[str], at: float) -> None:
        """Forget the jobs not in ``live`` (a snapshot's, or the passes' that take no snapshot)."""
        for gone in self.specs.keys() - live:
            del self.specs[gone]
        for gone in self.views.keys() - live:
            del self.views[gone]
        self.pruned_at = at


def _specs(s: Session, ids: list[str], cache: dict[str, JobSpec]) -> None:
    """Read into ``cache`` the specs of the jobs ``ids`` that it lacks."""
    missing = [i for i in ids if i not in cache]
    for k in range(0, len(missing), _SPECS_PER_QUERY):
        chunk = missing[k:k + _SPECS_PER_QUERY]
        for jid, spec in s.execute(select(JobRow.id, JobRow.spec).where(JobRow.id.in_(chunk))):
            cache[jid] = JobSpec.from_json(spec)


def snapshot(s: Session, generation: int = 0, links: Links | None = None, cache: ViewCache | None = None,
             device_caps: Mapping[str, int] | None = None,
             project_caps: Mapping[str, int] | None = None) -> tuple[ClusterView, dict[str, Seen]]:
    """The immutable view the policy decides over: nodes that are up (the drained ones named in ``drained``),
    and every job that waits for or holds devices (a migration's target devices count as held: they are
    reserved), with its owner; ``links``: the network between clusters and regions as the settings give it
    (TIDAL_REGION_GBPS, else :class:`Links`'s default), with the rate measured from one region to another where
    there is one (:mod:`tidal.control.linkrates`); ``device_caps``: the most devices each user may hold (none:
    no cap); ``project_caps``: each project's. With it, what the view was made of for each live job
    (:class:`Seen`). ``cache``: what the last pass's snapshot kept (:class:`ViewCache`)."""
    nodes = list(s.scalars(select(NodeRow).where(NodeRow.up.is_(True)).order_by(NodeRow.name)))
    tree: dict[str, dict[str, list[Node]]] = {}
    for n in nodes:
        tree.setdefault(n.region, {}).setdefault(n.cluster, []).append(Node(n.name, n.devices))
    topo = Topology(tuple(Region(r, tuple(Cluster(c, tuple(ns)) for c, ns in cs.items()))
                          for r, cs in tree.items()))
    waiting = s.execute(select(*_WAITING_COLUMNS).where(JobRow.state.in_((S.PENDING.value, S.PREEMPTED.value))))
    active = s.execute(select(*_ACTIVE_COLUMNS).where(JobRow.state.in_([st.value for st in jobs.ACTIVE])))
    rows = [*waiting, *active]
    cache = cache or ViewCache()
    cache.prune({r.id for r in rows}, cache.pruned_at)
    _specs(s, [r.id for r in rows], cache.specs)
    views: dict[str, JobView] = {}
    seen: dict[str, Seen] = {}
    for j in rows:
        st = S(j.state)
        seen[j.id] = Seen(st, bool(j.held), j.reason_code, j.reason)
        if j.held and st is S.PREEMPTED:
            continue
        if st in (S.PENDING, S.PREEMPTED):
            made = cache.views.get(j.id)
            if made is None or made[0] != j:
                made = cache.views[j.id] = (j, _view(j, st, (), cache.specs[j.id]))
            views[j.id] = made[1]
            continue
        cache.views.pop(j.id, None)
        if st is S.RUNNING and j.op is not None:
            st = S.CHECKPOINTING if j.op_purpose not in ("launch", "restore") else S.RESTORING
        placement = tuple(DeviceRef(p["node"], int(p["device"])) for p in j.placement or ())
        views[j.id] = _view(j, st, placement, cache.specs[j.id])
        if j.target:
            tgt = tuple(DeviceRef(n, int(i)) for n, i in j.target)
            views[f"{j.id}@target"] = JobView(id=f"{j.id}@target", ranks=len(tgt), tier=Tier.PREMIUM,
                                              submitted_at=j.submitted_at, state=S.MIGRATING, placement=tgt)
    measured = linkrates.links(s, links or Links())
    drained = frozenset(n.name for n in nodes if n.drain is not None)
    return ClusterView(topology=topo, jobs=views, generation=generation, links=measured, drained=drained,
                       device_caps=device_caps or {}, project_caps=project_caps or {}), seen


def _view(j: Any, st: JobState, placement: tuple[DeviceRef, ...], spec: JobSpec) -> JobView:
    """The policy's view of the job of row ``j`` (in state ``st``, holding ``placement``)."""
    lo, hi = spec.min_devices or 1, spec.max_devices or j.ranks
    if j.pinned_devices:  # resized by hand: the scheduler keeps that size
        lo = hi = j.pinned_devices
    tier = Tier.parse(j.tier)
    attained = float(j.attained_device_s or 0.0)
    return JobView(id=j.id, ranks=j.ranks, tier=tier, submitted_at=j.submitted_at, state=st, min_devices=lo,
                   max_devices=hi, placement=placement, started_at=j.started_at, project=spec.project or "default",
                   requested_tier=spec.tier if spec.tier > tier else None, home_cluster=spec.cluster,
                   home_region=spec.region, image_gb=_image_gb(j.progress, j.ranks), attained_device_s=attained,
                   duration_hint=spec.runtime, last_cluster=j.last_cluster,
                   remaining_hint=run_time_left(spec.runtime, attained, j.ranks), owner=j.owner)


def _image_gb(progress: dict[str, Any] | None, ranks: int) -> float | None:
    """A checkpoint image of the job, GB, as its last heartbeats saw it (``progress``): its ranks' resident
    memory and, on GPUs, each rank's GPU memory (which the checkpoint copies to the host first); None before
    any."""
    prog = progress or {}
    rss = prog.get("rss_bytes")
    if not rss:
        return None
    return (float(rss) + ranks * float(prog.get("gpu_rank_bytes", 0))) / 1e9

