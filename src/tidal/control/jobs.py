"""Job operations of the control plane: submission, user requests (preempt, resume, migrate, cancel),
the actions they dispatch to agents, and what the agents' results and exit reports do to a job.

Every function runs inside one :meth:`Database.tx` transaction. State changes go through the core
lifecycle table (:func:`tidal.core.advance`), so an invalid transition raises instead of corrupting the
job, and each one is recorded as an event with its cause. A job has at most one action in flight
(``op``); results of any other action, or reports from an older attempt, are stale and ignored.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from tidal.control.history import new_id, record
from tidal.control.store.models import ActionRow, CheckpointRow, CheckpointState, JobRow, NodeRow, User
from tidal.core import TERMINAL, DeviceRef, JobSpec, JobState, Tier, advance, protocol, rank_map
from tidal.errors import Conflict, NotFound, ValidationError
from tidal.policy.admission import Quotas, decide

S = JobState
log = logging.getLogger(__name__)
# States in which the job's ranks exist (or are being created) on a node.
ACTIVE = frozenset({S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.RESTORING})


def state(job: JobRow) -> JobState:
    return JobState(job.state)


def transition(s: Session, job: JobRow, new: JobState, cause: str | None, detail: str = "") -> str:
    advance(state(job), new, job=job.id)
    job.state = new.value
    if new in TERMINAL:
        job.finished_at = time.time()
        job.placement = []
        job.target = None
        job.op = None
        job.op_purpose = None
        drop_actions(s, job.id)
    node = job.placement[0]["node"] if job.placement else None
    return record(s, new.value, job_id=job.id, node=node, cause=cause, detail=detail)


def drop_actions(s: Session, job_id: str, kinds: Iterable[str] = ("launch", "restore", "checkpoint")) -> None:
    """Actions not yet done for the job will never matter again: their results become stale."""
    for a in s.scalars(select(ActionRow).where(ActionRow.job_id == job_id,
                                              ActionRow.status.in_(("pending", "sent")),
                                              ActionRow.kind.in_(tuple(kinds)))):
        a.status = "dropped"


# -- submission and lookup ------------------------------------------------------------------------------
def submit(s: Session, spec: JobSpec, owner: str, cause: str,
           quotas: Quotas | None = None) -> tuple[JobRow, str]:
    """Returns the job and, if it was admitted at a lower tier than asked for, why. ``quotas``: a premium
    or standard job over its project's quota is admitted as basic (the spec keeps the tier asked for; the
    job's ``tier`` is the one admitted)."""
    if not os.path.isdir(spec.workdir):
        raise ValidationError(f"workdir {spec.workdir} does not exist", field="workdir",
                              hint="the working directory must exist at the same path on every node")
    tier, why = spec.tier, ""
    if quotas is not None and spec.tier is not Tier.BASIC:
        d = decide(quotas, _capacity(s), spec.project, spec.tier, spec.ranks, _guaranteed_use(s, spec.project))
        tier, why = d.tier, d.reason
    jid = secrets.token_hex(4)
    values: dict[str, Any] = dict(id=jid, name=spec.name, owner=owner, spec=spec_to_json(spec),
                                  tier=tier.value, ranks=spec.ranks, state=S.PENDING.value, held=False,
                                  submitted_at=time.time(), restarts=0, attempt=0, placement=[])
    # A Core insert (no unit-of-work bookkeeping): submission is the hot path of the API. One cached
    # statement, the values as parameters; its submission number computed in the same statement.
    s.execute(_INSERT_JOB, values)
    record(s, "submitted", job_id=jid, cause=cause,
           detail=f"{spec.tier.value} job {spec.name!r} of {spec.ranks} rank(s) by {owner}"
                  + (f"; admitted as {tier.value}: {why}" if why else ""))
    return JobRow(**values), why


def _capacity(s: Session) -> int:
    return int(s.scalar(select(func.coalesce(func.sum(NodeRow.devices), 0))) or 0)


def _guaranteed_use(s: Session, project: str) -> int:
    """Devices asked for by the project's unfinished jobs admitted at a guaranteed tier. Two submissions
    racing on PostgreSQL may both count without the other (read committed): quotas are kept to within
    the jobs submitted at the same instant."""
    rows = s.execute(select(JobRow.ranks, JobRow.spec).where(
        JobRow.tier != Tier.BASIC.value, JobRow.state.not_in(tuple(t.value for t in TERMINAL))))
    return sum(ranks for ranks, spec in rows if (spec.get("project") or "default") == project)


_INSERT_JOB = insert(JobRow).values(
    seq=select(func.coalesce(func.max(JobRow.seq), 0) + 1).scalar_subquery())


def spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "command": list(spec.command), "workdir": spec.workdir, "ranks": spec.ranks,
        "tier": spec.tier.value, "min_devices": spec.min_devices, "max_devices": spec.max_devices,
        "env": dict(spec.env), "checkpoint_every": spec.checkpoint_every, "max_restarts": spec.max_restarts,
        "owner": spec.owner, "project": spec.project,
    }


def get(s: Session, job_id: str, *, owner: str | None) -> JobRow:
    """The job, if ``owner`` may see it (None: an admin sees every job). Others' jobs are 404: their
    existence is not disclosed."""
    job = s.get(JobRow, job_id)
    if job is None or (owner is not None and job.owner != owner):
        raise NotFound(f"no job {job_id}", job=job_id)
    return job


def checkpoints(s: Session, job_id: str) -> list[CheckpointRow]:
    """The job's checkpoints in the store, oldest first: committed ones, and bad ones kept for inspection."""
    return list(s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job_id,
                                                      CheckpointRow.retained.is_(True))
                          .order_by(CheckpointRow.created_at)))


def _good(rows: Iterable[CheckpointRow]) -> list[CheckpointRow]:
    return [r for r in rows if r.state is CheckpointState.COMMITTED]


def restore_source(s: Session, job: JobRow) -> CheckpointRow | None:
    """The checkpoint the job resumes from: the one it was set to resume from, if still good, else its newest
    good one (None: it starts from scratch)."""
    good = _good(checkpoints(s, job.id))
    chosen = [r for r in good if r.id == job.resume_from]
    return chosen[0] if chosen else (good[-1] if good else None)


def retired(rows: Sequence[CheckpointRow], keep: int, protect: str | None) -> list[CheckpointRow]:
    """Retention: of ``rows`` (oldest first), those to drop so that the newest ``keep`` good ones stay. Bad
    ones are kept for inspection and do not count; ``protect`` (the checkpoint the job resumes from) stays
    whatever its age."""
    good = _good(rows)
    return [r for r in good[: max(0, len(good) - keep)] if r.id != protect]


# -- devices ----------------------------------------------------------------------------------------------
def held_devices(job: JobRow) -> list[DeviceRef]:
    out = [DeviceRef(p["node"], int(p["device"])) for p in job.placement]
    out += [DeviceRef(n, int(i)) for n, i in job.target or ()]
    return out


def free_devices(s: Session) -> dict[str, list[int]]:
    """Free device indexes of every node that is up."""
    free = {n.name: set(range(n.devices)) for n in s.scalars(select(NodeRow).where(NodeRow.up.is_(True)))}
    for job in s.scalars(select(JobRow).where(JobRow.state.in_([st.value for st in ACTIVE]))):
        for d in held_devices(job):
            free.get(d.node, set()).discard(d.index)
    return {n: sorted(v) for n, v in sorted(free.items())}


# -- actions ------------------------------------------------------------------------------------------------
def new_action(s: Session, job: JobRow, node: str, order: protocol.Order, cause: str | None,
               *, track: bool = True, op: str | None = None) -> ActionRow:
    """Queue an action for ``node``'s agent. Tracked actions are the job's operation in flight: one per
    node for an operation over several nodes (same ``op``), whose outcome is taken once all are done."""
    a = ActionRow(id=new_id("a"), job_id=job.id, node=node, kind=order.kind, payload=protocol.encode(order),
                  status="pending",
                  cause=cause, created_at=time.time())
    a.op = op or a.id
    s.add(a)
    s.info["new_actions"] = True  # wakes the agents' long-polls at commit
    if track:
        job.op = a.op
    return a


def nodes_of(placement: Iterable[dict[str, Any]]) -> list[str]:
    """The nodes a job's ranks are on, in the order of their lowest rank."""
    out: list[str] = []
    for p in sorted(placement, key=lambda p: int(p["rank"])):
        if p["node"] not in out:
            out.append(p["node"])
    return out


def rendezvous(job: JobRow, tag: str) -> protocol.Rendezvous | None:
    """Where the ranks of a distributed job (re)build their torch.distributed group: the store hosted by
    the control plane, and keys unique to this build."""
    if job.ranks < 2:
        return None
    try:
        from tidal.mechanisms.interpose.storeserver import shared

        addr = shared().addr
    except Exception as exc:  # no torch here: only scripts that use torch.distributed will miss it
        log.warning("no rendezvous store for job %s: %s", job.id, exc)
        return None
    return protocol.Rendezvous(addr=addr, prefix=f"{job.id}/{job.attempt}/{tag}")


def _parts(c: CheckpointRow) -> list[str]:
    return list(c.parts or [c.id])


def start(s: Session, job: JobRow, devices: list[DeviceRef], cause: str | None, keep: int) -> None:
    """Launch the job on ``devices`` (rank r on ``devices[r]``, over one node or several), or restore it
    there from the checkpoint it resumes from (:func:`restore_source`) when it has one."""
    if len(devices) != job.ranks:
        raise Conflict(f"job {job.id} has {job.ranks} rank(s), placement gives {len(devices)} device(s)",
                       job=job.id)
    source = restore_source(s, job)
    restore = source is not None
    how = f"restoring from checkpoint {source.id}" if source is not None else "launching"
    by_node: dict[str, list[tuple[int, DeviceRef]]] = {}
    for r, d in enumerate(devices):
        by_node.setdefault(d.node, []).append((r, d))
    where = "; ".join(f"{n} devices {[d.index for _, d in rs]}" for n, rs in by_node.items())
    job.placement = [{"rank": r, "node": d.node, "device": d.index, "pid": None}
                     for r, d in enumerate(devices)]
    job.target = None
    transition(s, job, S.RUNNING if state(job) is S.PENDING else S.RESTORING, cause, f"on {where}, {how}")
    job.attempt += 1
    job.exited = {}
    job.opstate = None
    spec = job.spec
    owner = s.get(User, job.owner)
    rdv = rendezvous(job, "start")
    op = new_id("o")
    for node, ranks in by_node.items():
        noderow = s.get(NodeRow, node)
        cpus = noderow.cpus if noderow else []
        fields: dict[str, Any] = dict(
            job_id=job.id, attempt=job.attempt, argv=spec["command"], workdir=spec["workdir"], env=spec["env"],
            world_size=job.ranks, local_world_size=len(ranks),
            # The ranks run under the owner's Unix account (the agent drops to it inside the rank).
            unix_user=owner.unix_user if owner else None,
            ranks=[protocol.RankSlot(rank=r, local_rank=i, device=d.index,
                                     cpus=cpus[d.index] if d.index < len(cpus) else None)
                   for i, (r, d) in enumerate(ranks)],
            rendezvous=rdv,
            fs=any(r == 0 for r, _ in ranks),  # the node of rank 0 keeps the working directory
        )
        order: protocol.Order = (protocol.Launch(**fields) if source is None else protocol.Restore(
            **fields, checkpoint=protocol.CheckpointRef(id=source.id, parts=_parts(source))))
        new_action(s, job, node, order, cause, op=op)
    job.op_purpose = "restore" if restore else "launch"


def _next_checkpoint_id(s: Session, job: JobRow) -> str:
    n = s.scalar(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.job_id == job.id)) or 0
    return f"{n + 1:06d}-{secrets.token_hex(3)}"


def _keep_ids(s: Session, job: JobRow, new: list[str]) -> list[str]:
    """Store checkpoints an agent must keep when it applies retention: the parts of every checkpoint the
    control plane still lists (its newest ``keep`` good ones, the bad ones kept for inspection, the one
    it resumes from) and of the one being written. An agent retires a
    checkpoint only once it is no longer listed: the new one may never be committed (a part fails, the
    agent dies before its result arrives), and until it is, the oldest listed one is still a checkpoint
    of the job. So the store holds ``keep + 1`` checkpoints between a commit and the next checkpoint."""
    return [p for c in checkpoints(s, job.id) for p in _parts(c)] + new


def checkpoint(s: Session, job: JobRow, purpose: str, cause: str | None, keep: int) -> None:
    """Checkpoint a running job. ``purpose``: periodic (it continues), hold / preempt (stopped; a hold is
    not resumed automatically) or migrate (stopped, then restored on ``job.target``).

    On one node, one action does it all. Over several nodes it takes four steps, each an action per node,
    each step on every node before the next: ``cut`` (every rank says how many collectives it has
    announced), ``park`` (every rank runs to the largest count and waits), ``checkpoint`` (every rank drops
    its group, is dumped and stored as that node's part; for a stop it stays frozen), then ``finish``: once
    every part is stored and the job checkpoint committed, kill the frozen ranks or let them all rebuild
    their group and go on; if a step failed anywhere, let every rank go on."""
    if state(job) is not S.RUNNING or job.op is not None:
        raise Conflict(f"job {job.id} is busy ({_busy(job)}); try again in a moment", job=job.id, busy=True)
    nodes = nodes_of(job.placement)
    transition(s, job, S.CHECKPOINTING, cause, f"{purpose} checkpoint")
    then: protocol.Then = "continue" if purpose == "periodic" else "kill"
    ck = _next_checkpoint_id(s, job)
    op = new_id("o")
    if len(nodes) == 1:
        job.opstate = {"phase": "single", "checkpoint_id": ck}
        new_action(s, job, nodes[0], protocol.Checkpoint(
            job_id=job.id, attempt=job.attempt, then=then, checkpoint_id=ck, keep_ids=_keep_ids(s, job, [ck]),
            rendezvous=rendezvous(job, ck)), cause, op=op)
    else:
        epoch = secrets.randbelow(1 << 48)
        job.opstate = {"phase": "cut", "checkpoint_id": ck, "epoch": epoch, "then": then}
        for node in nodes:
            new_action(s, job, node, protocol.CutCounts(job_id=job.id, attempt=job.attempt, epoch=epoch),
                       cause, op=op)
    job.op_purpose = purpose


def _busy(job: JobRow) -> str:
    if job.op_purpose in ("launch", "restore"):
        return "starting"
    return (job.op_purpose and f"{job.op_purpose} checkpoint in progress") or job.state


# -- user requests ----------------------------------------------------------------------------------------
def preempt(s: Session, job: JobRow, cause: str, keep: int) -> None:
    """Checkpoint, release the devices and hold the job until ``resume``."""
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if st is S.PENDING:
        transition(s, job, S.HELD, cause, "held before it started")
    elif st is S.HELD or (st is S.PREEMPTED and job.held):
        return
    elif st is S.PREEMPTED:
        job.held = True
        record(s, "held", job_id=job.id, cause=cause)
    else:
        checkpoint(s, job, "hold", cause, keep)


def resume(s: Session, job: JobRow, cause: str, from_: str | None = None) -> None:
    """Release a hold (a no-op on a job that is not held). ``from_``: the checkpoint a stopped job resumes
    from, instead of its newest one."""
    st = state(job)
    if from_ is not None:
        row = s.get(CheckpointRow, from_)
        if row is None or row.job_id != job.id or not row.retained:
            raise ValidationError(f"job {job.id} has no checkpoint {from_!r}", field="from", checkpoint=from_,
                                  hint=f"`tidal checkpoints {job.id}` lists its checkpoints")
        if row.state is CheckpointState.BAD:
            raise Conflict(f"checkpoint {from_} of job {job.id} is bad (it failed verification) and cannot be "
                           "restored", field="from", checkpoint=from_, state=row.state.value,
                           hint=f"pick a committed one: `tidal checkpoints {job.id}`")
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if from_ is not None:
        if st in ACTIVE:
            raise Conflict(f"job {job.id} is {job.state}: only a stopped job can resume from a chosen checkpoint",
                           job=job.id, state=job.state, field="from",
                           hint=f"`tidal preempt {job.id}` first, then `tidal resume {job.id} --from {from_}`")
        job.resume_from = from_
        record(s, "resume_from", job_id=job.id, cause=cause, detail=f"it resumes from checkpoint {from_}")
    if st is S.HELD:
        transition(s, job, S.PENDING, cause, "released")
    elif job.held:
        job.held = False
        record(s, "released", job_id=job.id, cause=cause)


def migrate(s: Session, job: JobRow, to: str | None, cause: str, keep: int, rank: int | None = None) -> str:
    """Checkpoint the job, stop it and restore it elsewhere: every rank on ``to`` (default: other nodes
    with room, as few as possible), or only rank ``rank`` onto ``to`` (the others stay where they are)."""
    st = state(job)
    if st is not S.RUNNING or job.op is not None:
        if st in TERMINAL or st in (S.PENDING, S.HELD, S.PREEMPTED):
            raise Conflict(f"job {job.id} is not running (it is {job.state})", job=job.id, state=job.state)
        raise Conflict(f"job {job.id} is busy ({_busy(job)}); try again in a moment", job=job.id, busy=True)
    free = free_devices(s)
    if to is not None:
        if s.get(NodeRow, to) is None:
            raise NotFound(f"no node {to}", field="to", node=to)
        if to not in free:
            raise Conflict(f"node {to} is down", field="to", node=to)
    current = sorted(job.placement, key=lambda p: int(p["rank"]))
    if rank is not None:
        if to is None:
            raise ValidationError("moving one rank needs a destination node (--to)", field="to")
        if not 0 <= rank < job.ranks:
            raise ValidationError(f"job {job.id} has ranks 0..{job.ranks - 1}, not {rank}", field="rank")
        if current[rank]["node"] == to:
            raise Conflict(f"rank {rank} of job {job.id} already runs on {to}", field="to", node=to)
        if not free[to]:
            raise Conflict(f"node {to} has no free device for rank {rank} of job {job.id}", field="to", node=to)
        moved = [[p["node"], int(p["device"])] for p in current]
        moved[rank] = [to, free[to][0]]
        job.target = moved
        checkpoint(s, job, "migrate", cause, keep)
        return to
    need = job.ranks
    here = set(nodes_of(job.placement))
    if to is not None:
        own = [int(p["device"]) for p in current if p["node"] == to]
        room = sorted(free[to] + own)
        if to in here and len(here) == 1:
            raise Conflict(f"job {job.id} already runs on {to}", field="to", node=to)
        if len(room) < need:
            raise Conflict(f"node {to} has {len(room)} free device(s); job {job.id} needs {need}",
                           field="to", node=to)
        job.target = [[to, i] for i in room[:need]]
    else:
        # Every rank onto a device the job does not hold: other nodes first; one node if one fits (the
        # fullest, so whole nodes stay free for large gangs), else as few nodes as possible.
        others = {n: idx for n, idx in free.items() if n not in here}
        fits = sorted((len(idx), n) for n, idx in others.items() if len(idx) >= need)
        if fits:
            job.target = [[fits[0][1], i] for i in others[fits[0][1]][:need]]
        else:
            spread: list[list[Any]] = []
            for n, idx in sorted(free.items(), key=lambda kv: (kv[0] in here, -len(kv[1]), kv[0])):
                spread += [[n, i] for i in idx[: need - len(spread)]]
            if len(spread) < need:
                raise Conflict(f"no other node has room for job {job.id}: it needs {need} device(s) it does "
                               f"not hold, {len(spread)} are free", hint="free some devices or add a node")
            job.target = spread
    checkpoint(s, job, "migrate", cause, keep)
    return ", ".join(dict.fromkeys(n for n, _ in job.target))


def pack(free: dict[str, list[int]], own: list[DeviceRef], ranks: int, devices: int) -> list[DeviceRef] | None:
    """Rank → device for ``ranks`` ranks on ``devices`` devices chosen among ``free`` and the job's ``own``:
    as few nodes as possible (the job's own nodes first, then those with most room), ranks spread evenly
    and contiguous ranks together. None when there are not enough devices."""
    room: dict[str, set[int]] = {n: set(idx) for n, idx in free.items()}
    for d in own:
        if d.node in room:
            room[d.node].add(d.index)
    mine = {d.node for d in own}
    chosen: list[DeviceRef] = []
    for n in sorted(room, key=lambda n: (n not in mine, -len(room[n]), n)):
        chosen += [DeviceRef(n, i) for i in sorted(room[n])[: devices - len(chosen)]]
        if len(chosen) == devices:
            return list(rank_map(tuple(chosen), ranks))
    return None


def device_count(job: JobRow) -> int:
    return len({(p["node"], p["device"]) for p in job.placement})


def resize(s: Session, job: JobRow, devices: int | None, cause: str, keep: int) -> dict[str, Any]:
    """``tidal resize``: run the job's W ranks on ``devices`` devices (a consistent cut, a checkpoint of
    every rank, a restore with the new packing), and pin that number until ``devices=None`` (``--auto``)
    gives it back to the scheduler."""
    st = state(job)
    lo, hi = int(job.spec.get("min_devices") or 1), int(job.spec.get("max_devices") or job.ranks)
    if devices is None:
        job.pinned_devices = None
        record(s, "resize_auto", job_id=job.id, cause=cause, detail="the scheduler may resize it again")
        return {"devices": device_count(job) or None, "pinned": False}
    if devices < 1:
        raise ValidationError(f"--devices must be at least 1, not {devices}", field="devices")
    if devices > job.ranks:
        raise ValidationError(f"job {job.id} has {job.ranks} rank(s): it cannot use {devices} devices "
                              "(at most one rank per device)", field="devices")
    if not lo <= devices <= hi:
        raise ValidationError(f"job {job.id} may run on {lo}..{hi} devices, not {devices}", field="devices",
                              hint="its bounds are set at submission (--min-devices/--max-devices)")
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if st is not S.RUNNING:
        if st in (S.PENDING, S.HELD, S.PREEMPTED):
            raise Conflict(f"job {job.id} is not running (it is {job.state}): only a running job can be "
                           "resized", job=job.id, state=job.state)
        raise Conflict(f"job {job.id} is busy ({_busy(job)}); try again in a moment", job=job.id, busy=True)
    if job.op is not None:
        raise Conflict(f"job {job.id} is busy ({_busy(job)}); try again in a moment", job=job.id, busy=True)
    now = device_count(job)
    if devices == now:
        job.pinned_devices = devices
        record(s, "resize_pinned", job_id=job.id, cause=cause, detail=f"stays on {devices} device(s), pinned")
        return {"devices": devices, "pinned": True}
    own = [DeviceRef(p["node"], int(p["device"])) for p in job.placement]
    target = pack(free_devices(s), own, job.ranks, devices)
    if target is None:
        raise Conflict(f"there is no room for job {job.id} on {devices} devices", field="devices",
                       hint="it goes on running as it was; free some devices or add a node")
    job.pinned_devices = devices
    resize_to(s, job, target, cause, keep, why=f"from {now} to {devices} device(s), pinned by its owner")
    return {"devices": devices, "pinned": True}


def resize_to(s: Session, job: JobRow, target: list[DeviceRef], cause: str | None, keep: int, why: str) -> None:
    """Move the job to ``target`` (rank → device, D distinct devices) through a checkpoint."""
    job.target = [[d.node, d.index] for d in target]
    record(s, "resize", job_id=job.id, cause=cause, detail=why)
    checkpoint(s, job, "resize", cause, keep)


def _kill(job: JobRow, report: bool = False) -> protocol.Kill:
    return protocol.Kill(job_id=job.id, attempt=job.attempt, report=report)


def cancel(s: Session, job: JobRow, cause: str) -> None:
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    for node in {p["node"] for p in job.placement}:
        new_action(s, job, node, _kill(job), cause, track=False)
    transition(s, job, S.CANCELLED, cause)


# -- what agents report -------------------------------------------------------------------------------------
def on_result(s: Session, a: ActionRow, ok: bool, data: dict[str, Any], error: str | None, keep: int) -> None:
    job = s.get(JobRow, a.job_id)
    if job is None:
        return
    if a.kind == "kill":
        if job.opstate and job.opstate.get("phase") == "failing":
            _merge_exits(job, data.get("ranks", ()))
            _settle_failure(s, job, a.id, keep)
        return
    if job.op != a.op:
        return
    group = list(s.scalars(select(ActionRow).where(ActionRow.op == a.op)))
    if any(g.status in ("pending", "sent") for g in group):
        return  # the other nodes have not answered yet
    failed = [g for g in group if g.status == "failed"]
    err = "; ".join(f"{g.node}: {(g.result or {}).get('error')}" for g in failed)
    cause = a.id
    job.op = None
    if a.kind in ("launch", "restore"):
        _started(s, job, a.kind, group, failed, err, cause)
    elif a.kind == "cut":
        _cut_done(s, job, group, failed, err, cause)
    elif a.kind == "park":
        _parked(s, job, failed, err, cause, keep)
    elif a.kind == "checkpoint":
        _dumped(s, job, group, failed, err, cause, keep)
    elif a.kind == "finish":
        _finished(s, job, cause, keep)


def _started(s: Session, job: JobRow, kind: str, group: list[ActionRow], failed: list[ActionRow], err: str,
             cause: str) -> None:
    job.op_purpose = None
    if failed:
        for g in group:  # the nodes where it did start must not keep half a job running
            if g.status == "done":
                new_action(s, job, g.node, _kill(job), cause, track=False)
        if kind == "restore":
            damaged = [(g.node, c) for g in failed if (c := (g.result or {}).get("corrupt"))]
            if damaged and _fall_back(s, job, group[0], damaged, cause):
                return
            # Possibly transient (a node's disk, the store): try again, from the same checkpoint, as a restart.
            lost(s, job, cause, f"restore failed ({err})", stop_others=False)
            return
        job.error = err
        transition(s, job, S.FAILED, cause, f"{kind} failed: {err}")
        return
    pids = {int(r["rank"]): r["pid"] for g in group for r in (g.result or {}).get("ranks", [])}
    job.placement = [{**p, "pid": pids.get(int(p["rank"]))} for p in job.placement]
    job.started_at = time.time()
    detail = f"pids {[pids.get(r) for r in range(job.ranks)]}"
    if state(job) is S.RESTORING:
        transition(s, job, S.RUNNING, cause, f"restored, {detail}")
    else:
        record(s, "started", job_id=job.id, node=group[0].node, cause=cause, detail=detail)


def _fall_back(s: Session, job: JobRow, action: ActionRow, damaged: list[tuple[str, dict[str, Any]]],
               cause: str) -> bool:
    """A restore found its checkpoint damaged in the store: trying it again cannot help. Mark it bad (kept
    for inspection, never restored again) and requeue the job, without counting a restart, to resume from
    the newest good checkpoint older than it (or else the newest good one: the bad one may have been chosen
    with ``resume --from``); with none left, the job fails. False if the damage is not in the checkpoint the
    restore was given (then it is handled as any failed restore)."""
    given = action.payload.get("checkpoint") or {}
    row = s.get(CheckpointRow, given.get("id"))
    if row is None or row.state is not CheckpointState.COMMITTED \
            or not any(d.get("checkpoint") in _parts(row) for _, d in damaged):
        return False
    row.state = CheckpointState.BAD
    what = "; ".join(f"{d.get('message')} (found on {node})" for node, d in damaged)
    good = _good(checkpoints(s, job.id))
    older = [r for r in good if (r.created_at, r.id) < (row.created_at, row.id)]
    src = older[-1] if older else (good[-1] if good else None)
    if src is None:
        job.resume_from = None
        record(s, "checkpoint_bad", job_id=job.id, cause=cause,
               detail=f"checkpoint {row.id} is damaged: {what}; it is kept for inspection; no intact checkpoint "
                      "is left to resume from")
        job.error = (f"checkpoint {row.id} is damaged and job {job.id} has no other intact checkpoint to resume "
                     f"from; `tidal checkpoints {job.id}` lists what is kept; submit the job again to start over")
        transition(s, job, S.FAILED, cause, job.error)
        return True
    job.resume_from = src.id
    eid = record(s, "checkpoint_bad", job_id=job.id, cause=cause,
                 detail=f"checkpoint {row.id} is damaged: {what}; it is kept for inspection and not restored "
                        f"again; resuming from checkpoint {src.id}")
    lost(s, job, eid, f"checkpoint {row.id} is damaged", stop_others=False, restart=False)
    return True


def _ckpt_failed(s: Session, job: JobRow, cause: str, err: str) -> None:
    purpose, job.op_purpose = job.op_purpose, None
    job.target = None
    job.opstate = None
    transition(s, job, S.RUNNING, cause, f"{purpose} checkpoint failed, the job goes on: {err}")


def _finish(s: Session, job: JobRow, then: Literal["kill", "resume"], cause: str, **state_: Any) -> None:
    """The last step over several nodes: kill the held ranks, or let every rank go on. After the dump
    step every rank builds a new group (on the same keys everywhere), else the gates just open."""
    assert job.opstate is not None
    rebuild = job.opstate.get("phase") == "dump"
    job.opstate = {**job.opstate, "phase": "finish", "finish": then, **state_}
    op = new_id("o")
    for node in nodes_of(job.placement):
        rdv = job.opstate.get("rendezvous") if rebuild else None
        new_action(s, job, node, protocol.Finish(
            job_id=job.id, attempt=job.attempt, then=then, rebuild=rebuild,
            rendezvous=protocol.Rendezvous(**rdv) if rdv else None), cause, op=op)


def _cut_done(s: Session, job: JobRow, group: list[ActionRow], failed: list[ActionRow], err: str,
              cause: str) -> None:
    assert job.opstate is not None
    if failed:
        _finish(s, job, "resume", cause, error=err)
        return
    target = max((int(c) for g in group for c in (g.result or {}).get("counts", {}).values()), default=0)
    job.opstate = {**job.opstate, "phase": "park", "target": target}
    op = new_id("o")
    for node in nodes_of(job.placement):
        new_action(s, job, node, protocol.Park(job_id=job.id, attempt=job.attempt, epoch=job.opstate["epoch"],
                                               target=target), cause, op=op)


def _parked(s: Session, job: JobRow, failed: list[ActionRow], err: str, cause: str, keep: int) -> None:
    assert job.opstate is not None
    if failed:
        _finish(s, job, "resume", cause, error=err)
        return
    ck = job.opstate["checkpoint_id"]
    nodes = nodes_of(job.placement)
    parts = {n: f"{ck}.p{k}" for k, n in enumerate(nodes)}
    rdv = rendezvous(job, ck)
    job.opstate = {**job.opstate, "phase": "dump", "parts": list(parts.values()),
                   "rendezvous": protocol.encode(rdv) if rdv else None}
    op = new_id("o")
    then: protocol.Then = "continue" if job.opstate["then"] == "continue" else "hold"
    keep_ids = _keep_ids(s, job, list(parts.values()))
    holder = min(job.placement, key=lambda p: int(p["rank"]))["node"]
    for node in nodes:
        new_action(s, job, node, protocol.Checkpoint(
            job_id=job.id, attempt=job.attempt, then=then, checkpoint_id=parts[node], keep_ids=keep_ids,
            rendezvous=rdv, fs=node == holder,
            cut=protocol.Cut(epoch=job.opstate["epoch"], target=job.opstate["target"])), cause, op=op)


def _dumped(s: Session, job: JobRow, group: list[ActionRow], failed: list[ActionRow], err: str, cause: str,
            keep: int) -> None:
    assert job.opstate is not None
    multi = job.opstate.get("phase") == "dump"
    if failed:
        if multi:
            _finish(s, job, "resume", cause, error=err)
        else:
            _ckpt_failed(s, job, cause, err)
        return
    ck = job.opstate["checkpoint_id"]
    results = [g.result or {} for g in group]
    infos = [r["checkpoint"] for r in results]
    parts = [i["id"] for i in infos]
    _commit(s, job, ck, parts, sum(int(i["bytes"]) for i in infos), sum(int(i["stored_bytes"]) for i in infos),
            max(float(i["created_at"]) for i in infos), keep)
    if multi:
        _finish(s, job, "resume" if job.opstate["then"] == "continue" else "kill", cause)
        return
    _after_commit(s, job, cause, keep)


def _commit(s: Session, job: JobRow, ck: str, parts: list[str], nbytes: int, stored: int, created: float,
            keep: int) -> None:
    """The job checkpoint exists from here on: every part is stored. Older ones beyond ``keep`` are no
    longer retained (the agents delete their parts from the store)."""
    s.add(CheckpointRow(id=ck, job_id=job.id, created_at=created, bytes=nbytes, stored_bytes=stored,
                        retained=True, parts=parts, state=CheckpointState.COMMITTED))
    s.flush()
    for row in retired(checkpoints(s, job.id), keep, job.resume_from):
        row.retained = False
    job.resume_from = None  # the new checkpoint is where the job goes on from
    job.last_checkpoint_at = time.time()
    job.opstate = {**(job.opstate or {}), "committed": ck, "detail": f"checkpoint {ck} ({nbytes} bytes"
                   + (f", {len(parts)} parts)" if len(parts) > 1 else ")")}


def _finished(s: Session, job: JobRow, cause: str, keep: int) -> None:
    assert job.opstate is not None
    if job.opstate.get("error"):
        _ckpt_failed(s, job, cause, job.opstate["error"])
        return
    _after_commit(s, job, cause, keep)


def _after_commit(s: Session, job: JobRow, cause: str, keep: int) -> None:
    purpose, job.op_purpose = job.op_purpose, None
    detail = (job.opstate or {}).get("detail", "checkpoint")
    job.opstate = None
    if purpose == "periodic":
        transition(s, job, S.RUNNING, cause, detail)
    elif purpose in ("hold", "preempt"):
        job.placement = []
        job.held = purpose == "hold"
        transition(s, job, S.PREEMPTED, cause, detail + (", held" if job.held else ""))
    elif not job.target:  # a migration whose destination was lost meanwhile: requeue it, not held
        job.placement = []
        job.target = None
        transition(s, job, S.PREEMPTED, cause, detail + ", its destination is gone: requeued")
    else:  # migrate or resize
        before = device_count(job)
        job.placement = []
        target = [DeviceRef(n, int(i)) for n, i in job.target]
        where = f", to {', '.join(nodes_of_devices(target))}"
        if purpose == "resize":
            where += f" on {len(set(target))} device(s) (was {before})"
        eid = transition(s, job, S.MIGRATING, cause, detail + where)
        start(s, job, target, eid, keep)


def nodes_of_devices(devices: list[DeviceRef]) -> list[str]:
    return list(dict.fromkeys(d.node for d in devices))


def _merge_exits(job: JobRow, ranks: Iterable[dict[str, Any]]) -> None:
    exited = dict(job.exited or {})
    for r in ranks:
        exited.setdefault(str(r["rank"]), {k: r.get(k) for k in ("code", "signal", "at", "stopped")})
    job.exited = exited


def _bad(r: dict[str, Any]) -> bool:
    return not r.get("stopped") and (r.get("signal") is not None or r.get("code") != 0)


def on_exit(s: Session, job: JobRow, attempt: int, ranks: list[dict[str, Any]], cause: str,
            keep: int) -> bool:
    """Ranks of the job exited on their own (or were killed from outside Tidal). False when stale.

    The job succeeds once every rank has exited with code 0. When a rank fails, the others would fail at
    their next collective: they are stopped, and the failure is settled once every rank's end is known,
    the earliest failing rank being the root cause and the others its consequences."""
    if job.attempt != attempt or state(job) not in ACTIVE:
        return False
    _merge_exits(job, ranks)
    exited = job.exited or {}
    failing = job.opstate is not None and job.opstate.get("phase") == "failing"
    if not failing and any(_bad(r) for r in exited.values()):
        drop_actions(s, job.id)
        job.op = None
        here = {p["node"] for p in job.placement if str(p["rank"]) in {str(r["rank"]) for r in ranks}}
        others = [n for n in nodes_of(job.placement) if n not in here]
        job.opstate = {"phase": "failing", "purpose": job.op_purpose}
        for n in others:
            new_action(s, job, n, _kill(job, report=True), cause, track=False)
    if job.opstate is not None and job.opstate.get("phase") == "failing":
        _settle_failure(s, job, cause, keep)
        return True
    if len(exited) == job.ranks:
        _leave_op(s, job, cause)
        job.exit_code = 0
        transition(s, job, S.SUCCEEDED, cause, "every rank exited with code 0")
    return True


def _leave_op(s: Session, job: JobRow, cause: str) -> None:
    if state(job) is S.CHECKPOINTING:
        transition(s, job, S.RUNNING, cause, "exited during a checkpoint")
    job.op = None
    job.op_purpose = None
    job.opstate = None


def _settle_failure(s: Session, job: JobRow, cause: str, keep: int) -> None:
    """Once every rank's end is known: the earliest failure is the cause."""
    exited = job.exited or {}
    if len(exited) < job.ranks or state(job) not in ACTIVE:
        return
    bad = sorted(((r.get("at") or 0.0, int(k), r) for k, r in exited.items() if _bad(r)), key=lambda t: t[:2])
    if not bad:  # only ranks Tidal stopped: nothing failed on its own (cannot happen; be safe)
        _leave_op(s, job, cause)
        lost(s, job, cause, "its ranks were stopped", stop_others=False)
        return
    _, root, r = bad[0]
    rest = [f"rank {k}" for _, k, _ in bad[1:]]
    stopped = sorted(int(k) for k, x in exited.items() if x.get("stopped"))
    after = "".join([f"; then failed: {', '.join(rest)}" if rest else "",
                     f"; stopped by Tidal: ranks {stopped}" if stopped else ""])
    _leave_op(s, job, cause)
    if r.get("signal") is not None:
        lost(s, job, cause, f"rank {root} killed by signal {r['signal']} from outside Tidal{after}",
             stop_others=False)
        return
    job.exit_code = int(r.get("code") if r.get("code") is not None else 1)
    job.error = f"rank {root} exited with code {job.exit_code} (root cause){after}"
    transition(s, job, S.FAILED, cause, job.error)


def lost(s: Session, job: JobRow, cause: str, why: str, stop_others: bool = True, restart: bool = True) -> None:
    """The job's ranks are gone (node lost, killed from outside): requeue it to be restored from its last
    committed checkpoint (or launched afresh without one), up to ``max_restarts`` times. Its ranks still
    running on other nodes are stopped first (``stop_others``; not needed when every rank's end is known).
    ``restart=False``: requeued without counting a restart (its checkpoint was damaged, not the job lost)."""
    drop_actions(s, job.id)
    for node in nodes_of(job.placement) if stop_others else ():
        n = s.get(NodeRow, node)
        if n is not None and n.up:
            new_action(s, job, node, _kill(job), cause, track=False)
    job.op = None
    job.op_purpose = None
    job.opstate = None
    job.target = None
    limit = int(job.spec.get("max_restarts", 3))
    if restart and job.restarts >= limit:
        job.error = why
        transition(s, job, S.FAILED, cause, f"{why}; no restarts left ({limit})")
        return
    if restart:
        job.restarts += 1
    src = restore_source(s, job)
    detail = f"{why}; " + (f"restart {job.restarts}/{limit}, " if restart else "requeued ") + (
        f"from checkpoint {src.id}" if src is not None else "from scratch")
    # Walk the lifecycle table back to a waiting state.
    st = state(job)
    if st is S.CHECKPOINTING:
        job.placement = []
        transition(s, job, S.PREEMPTED, cause, detail)
        return
    if st is S.MIGRATING:
        transition(s, job, S.RESTORING, cause, why)
        st = S.RESTORING
    if st is S.RESTORING:
        transition(s, job, S.RUNNING, cause, why)
    job.placement = []
    transition(s, job, S.PENDING, cause, detail)
