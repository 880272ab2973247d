"""The reconcile loop: compare desired and observed state and act.

Each pass, in one transaction: expire nodes whose lease ran out (their jobs are requeued), take due
periodic checkpoints, then snapshot the cluster into a :class:`ClusterView`, ask the policy for actions
and turn the ones still valid into agent actions. The loop wakes on every commit (a submission, a result)
and at least every ``interval`` seconds.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import agents, deferral, jobs, linkrates
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


class Reconciler:
    """Runs ``policy`` over the cluster in ``db``. ``clock``: where it reads the time (wall time for
    leases, checkpoint timers and the policy's ``now``; monotonic time for its own pacing); by default the
    database's, the one every transaction of the control plane reads. ``device_caps``: read in each pass's
    transaction, the most devices each user may hold (users not named: no cap); None: no caps."""

    def __init__(self, db: Database, policy: Policy, *, interval: float = 0.5,
                 min_gap: float = 0.05, explain_every: float = 0.0, clock: Clock | None = None,
                 links: Links | None = None,
                 device_caps: Callable[[Session], Mapping[str, int]] | None = None) -> None:
        self.db = db
        self.policy = policy
        self.device_caps = device_caps
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
            # commit would make a burst quadratic.
            self._stop.wait(max(0.0, self.min_gap - (self.clock.monotonic() - t0)))
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
        with self.db.sessions() as s:
            if not self._anything_to_do(s, now):
                return
        with self.db.tx() as s:
            for node in s.scalars(select(NodeRow).where(NodeRow.up.is_(True), NodeRow.lease_until < now)):
                agents.expire(s, node, "lease expired")
            for job in self._due(s, now):
                checkpoint(s, job, "periodic", f"timer-{self._run}")
            deferral.release_due(s, f"reconcile-{self._run}")
            self._schedule(s, now)

    def _anything_to_do(self, s: Session, now: float) -> bool:
        expired = select(NodeRow.name).where(NodeRow.up.is_(True), NodeRow.lease_until < now).limit(1)
        return (s.scalar(expired) is not None or bool(self._due(s, now)) or self._worth_deciding(s)
                or self._explain_due(s) or bool(deferral.due(s)))

    def _explain_due(self, s: Session) -> bool:
        """Whether a pass should run only to say why new waiting jobs wait (see ``explain_every``)."""
        last = self._explained_at
        if last is not None and self.clock.monotonic() - last < self.explain_every:
            return False
        return _unexplained(s)

    def _due(self, s: Session, now: float) -> list[JobRow]:
        """Running jobs whose periodic checkpoint is due."""
        out = []
        for job in s.scalars(select(JobRow).where(JobRow.state == S.RUNNING.value, JobRow.op.is_(None))):
            every = jobs.spec_of(job).checkpoint_every
            since = max(job.last_checkpoint_at or 0.0, job.started_at or now)
            if every and now - since >= float(every):
                out.append(job)
        return out

    def _schedule(self, s: Session, now: float) -> None:
        if not self._worth_deciding(s) and not self._explain_due(s):
            return
        # A new generation every pass: the live loop hands the policy no event stream, so a stateful
        # policy must rebuild its indexes from the view each time (a stateless one reads the view anyway).
        self._passes += 1
        caps = self.device_caps(s) if self.device_caps is not None else None
        view, rows = snapshot(s, generation=self._passes, links=self.links, device_caps=caps)
        free = jobs.free_devices(s)
        self._unfit = {j: p for j, p in self._unfit.items() if j in rows}
        freeing: dict[str, int] = {}  # job → devices of its placement that preemptions have yet to free
        for a in self.policy.decide(view, [], now):
            job = rows.get(a.job_id)
            if job is None:
                continue
            # A move or resize may keep some of the job's own devices.
            own = ({(p["node"], int(p["device"])) for p in job.placement}
                   if a.kind in (ActionKind.MIGRATE, ActionKind.RESIZE) else set())
            new = [d for d in a.devices if (d.node, d.index) not in own]
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
        self._explain(s, rows, freeing)

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

    def _explain(self, s: Session, rows: dict[str, JobRow], freeing: dict[str, int]) -> None:
        """Store why each job still waits: the policy's reason, or the devices it waits to be freed."""
        self._explained_at = self.clock.monotonic()
        why = self.policy.reasons()
        cause = f"reconcile-{self._run}"
        for job in rows.values():
            st = jobs.state(job)
            if st not in (S.PENDING, S.PREEMPTED):
                continue
            if job.held:
                reason = policy_reasons.held()
            elif job.id in freeing:
                reason = policy_reasons.making_room(freeing[job.id])
            else:
                reason = why.get(job.id) or policy_reasons.queued()
            set_reason(s, job, reason, cause)

    def _worth_deciding(self, s: Session) -> bool:
        """Cheap pre-check (it reads only the jobs holding devices): the policy can only act when a job
        waits and either a device is free or a waiting job outranks basic (it may preempt)."""
        waiting = (JobRow.state == S.PENDING.value) | ((JobRow.state == S.PREEMPTED.value) & ~JobRow.held)
        if s.scalar(select(JobRow.id).where(waiting).limit(1)) is None:
            # Nothing waits: only growing a shrunk job into idle devices is left to decide.
            return self.policy.grows and any(jobs.free_devices(s).values()) and any(
                jobs.device_count(j) < (jobs.spec_of(j).max_devices or j.ranks) and not j.pinned_devices
                for j in s.scalars(select(JobRow).where(JobRow.state == S.RUNNING.value, JobRow.op.is_(None))))
        if any(jobs.free_devices(s).values()):
            return True
        urgent = waiting & (JobRow.tier != Tier.BASIC.value)
        return s.scalar(select(JobRow.id).where(urgent).limit(1)) is not None


def _unexplained(s: Session) -> bool:
    """Whether a waiting job has no reason yet (new, requeued or released): a pass must say why it waits."""
    waiting = JobRow.state.in_((S.PENDING.value, S.PREEMPTED.value)) & JobRow.reason_code.is_(None)
    return s.scalar(select(JobRow.id).where(waiting).limit(1)) is not None


def snapshot(s: Session, generation: int = 0, links: Links | None = None,
             device_caps: Mapping[str, int] | None = None) -> tuple[ClusterView, dict[str, JobRow]]:
    """The immutable view the policy decides over: nodes that are up, and every job that waits for or
    holds devices (a migration's target devices count as held: they are reserved), with its owner;
    ``links``: the network between clusters and regions as the settings give it (TIDAL_REGION_GBPS, else
    :class:`Links`'s default), with the rate measured from one region to another where there is one
    (:mod:`tidal.control.linkrates`); ``device_caps``: the most devices each user may hold (none: no cap)."""
    nodes = list(s.scalars(select(NodeRow).where(NodeRow.up.is_(True)).order_by(NodeRow.name)))
    tree: dict[str, dict[str, list[Node]]] = {}
    for n in nodes:
        tree.setdefault(n.region, {}).setdefault(n.cluster, []).append(Node(n.name, n.devices))
    topo = Topology(tuple(Region(r, tuple(Cluster(c, tuple(ns)) for c, ns in cs.items()))
                          for r, cs in tree.items()))
    live = [st.value for st in (S.PENDING, S.PREEMPTED, *jobs.ACTIVE)]
    rows = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.state.in_(live)))}
    views: dict[str, JobView] = {}
    for j in rows.values():
        st = jobs.state(j)
        if j.held and st is S.PREEMPTED:
            continue
        if st is S.RUNNING and j.op is not None:
            st = S.CHECKPOINTING if j.op_purpose not in ("launch", "restore") else S.RESTORING
        placement = tuple(DeviceRef(p["node"], int(p["device"])) for p in j.placement)
        spec = jobs.spec_of(j)
        lo, hi = spec.min_devices or 1, spec.max_devices or j.ranks
        if j.pinned_devices:  # resized by hand: the scheduler keeps that size
            lo = hi = j.pinned_devices
        tier = Tier.parse(j.tier)
        attained = float(j.attained_device_s or 0.0)
        views[j.id] = JobView(id=j.id, ranks=j.ranks, tier=tier, submitted_at=j.submitted_at,
                              state=st, min_devices=lo, max_devices=hi, placement=placement,
                              started_at=j.started_at, project=spec.project or "default",
                              requested_tier=spec.tier if spec.tier > tier else None,
                              home_cluster=spec.cluster, home_region=spec.region, image_gb=_image_gb(j),
                              attained_device_s=attained, duration_hint=spec.runtime, last_cluster=j.last_cluster,
                              remaining_hint=run_time_left(spec.runtime, attained, j.ranks), owner=j.owner)
        if j.target:
            tgt = tuple(DeviceRef(n, int(i)) for n, i in j.target)
            views[f"{j.id}@target"] = JobView(id=f"{j.id}@target", ranks=len(tgt), tier=Tier.PREMIUM,
                                              submitted_at=j.submitted_at, state=S.MIGRATING, placement=tgt)
    measured = linkrates.links(s, links or Links())
    return ClusterView(topology=topo, jobs=views, generation=generation, links=measured,
                       device_caps=device_caps or {}), rows


def _image_gb(job: JobRow) -> float | None:
    """A checkpoint image of the job, GB, as its last heartbeats saw it: its ranks' resident memory and, on
    GPUs, each rank's GPU memory (which the checkpoint copies to the host first); None before any."""
    prog = job.progress or {}
    rss = prog.get("rss_bytes")
    if not rss:
        return None
    return (float(rss) + job.ranks * float(prog.get("gpu_rank_bytes", 0))) / 1e9

