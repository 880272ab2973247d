"""What users ask of their jobs: preempt (hold), resume, migrate, resize, cancel. Each request is checked
against the job's state first; the work itself is a checkpoint (:mod:`~tidal.control.checkpointing`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import drains
from tidal.control.checkpointing import checkpoint
from tidal.control.dispatch import kill
from tidal.control.history import record
from tidal.control.jobs import ACTIVE, busy, device_count, free_devices, nodes_of, spec_of, state, transition
from tidal.control.reasons import clear, set_reason
from tidal.control.store.models import CheckpointRow, CheckpointState, JobRow, NodeRow
from tidal.core import TERMINAL, DeviceRef, JobState, rank_map
from tidal.core.units import size
from tidal.errors import Conflict, NotFound, ValidationError, named, shown
from tidal.policy import gpufit, reasons

S = JobState


def preempt(s: Session, job: JobRow, cause: str) -> None:
    """Checkpoint, release the devices and hold the job until ``resume``."""
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if st is S.PENDING:
        transition(s, job, S.HELD, cause, "held before it started")
        set_reason(s, job, reasons.held(), cause)
    elif st is S.HELD or (st is S.PREEMPTED and job.held):
        return
    elif st is S.PREEMPTED:
        job.held = True
        record(s, "held", job_id=job.id, cause=cause)
        set_reason(s, job, reasons.held(), cause)
    else:
        checkpoint(s, job, "hold", cause)


def resume(s: Session, job: JobRow, cause: str, from_: str | None = None) -> None:
    """Release a hold (a no-op on a job that is not held). ``from_``: the checkpoint a stopped job resumes
    from, instead of its newest one."""
    st = state(job)
    if from_ is not None:
        row = s.get(CheckpointRow, from_)
        if row is None or row.job_id != job.id or not row.retained:
            raise ValidationError(f"job {job.id} has no checkpoint {shown(from_)}", field="from",
                                  checkpoint=named(from_), hint=f"`tidal checkpoints {job.id}` lists its checkpoints")
        if row.state is CheckpointState.COMMITTING:
            raise Conflict(f"checkpoint {from_} of job {job.id} is still being committed to the store and cannot be "
                           "chosen yet", field="from", checkpoint=from_, state=row.state.value,
                           hint=f"wait until `tidal checkpoints {job.id}` shows it committed")
        if row.state is CheckpointState.BAD:
            raise Conflict(f"checkpoint {from_} of job {job.id} is bad (it failed verification) and cannot be "
                           "restored", field="from", checkpoint=from_, state=row.state.value,
                           hint=f"pick a committed one: `tidal checkpoints {job.id}`")
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    if st is S.HELD and job.reason_code == reasons.Why.DEFERRED.value:
        raise Conflict(f"job {job.id} is deferred by admission against the load: it starts when its expected "
                       "attainment meets its target", job=job.id, state=job.state, reason=job.reason,
                       hint="cancel it and submit it at a lower tier to start sooner")
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
        clear(job)


def migrate(s: Session, job: JobRow, to: str | None, cause: str, rank: int | None = None,
            region: str | None = None, cluster: str | None = None) -> str:
    """Checkpoint the job, stop it and restore it elsewhere: every rank on ``to`` (default: other nodes
    with room, as few as possible; in ``region`` or ``cluster`` where given), or only rank ``rank`` onto
    ``to`` (the others stay where they are). A job pinned to D devices stays pinned: moved whole onto D
    devices, or, when one rank of a shared device moved away, pinned to the devices it then runs on (see
    :mod:`~tidal.control.checkpointing`). Into another region whose store is not the job's, the restore
    replicates its checkpoint there first (:mod:`~tidal.control.regionstores`)."""
    st = state(job)
    if st is not S.RUNNING or job.op is not None:
        if st in TERMINAL or st in (S.PENDING, S.HELD, S.PREEMPTED):
            raise Conflict(f"job {job.id} is not running (it is {job.state})", job=job.id, state=job.state)
        raise Conflict(f"job {job.id} is busy ({busy(job)}); try again in a moment", job=job.id, busy=True)
    free = free_devices(s, schedulable=True)  # a drained node takes nothing new: no move there either
    asked: set[str] = set()
    if region is not None or cluster is not None:
        if to is not None or rank is not None:
            raise ValidationError("give a node (--to, --rank) or a region or cluster to move to, not both",
                                  field="to")
        asked = _nodes_in(s, region, cluster)
        free = {n: idx for n, idx in free.items() if n in asked}
    spec = spec_of(job)
    if spec.region is not None or spec.cluster is not None:
        allowed = _nodes_in(s, spec.region, spec.cluster, check=False)
        if (to is not None and to not in allowed) or ((region or cluster) and not asked & allowed):
            pin = " and ".join(f"{k} {v}" for k, v in (("region", spec.region), ("cluster", spec.cluster)) if v)
            where = to or " ".join(f"{k} {v}" for k, v in (("region", region), ("cluster", cluster)) if v)
            raise Conflict(f"job {job.id} is pinned to {pin}: it cannot move to {where}", field="to",
                           hint="submit it again without --region/--cluster to let it run anywhere")
        free = {n: idx for n, idx in free.items() if n in allowed}
    if to is not None:
        row = s.get(NodeRow, to)
        if row is None:
            raise NotFound(f"no node {to}", field="to", node=to)
        if row.drain is not None and row.up:
            raise Conflict(f"node {to} is drained ({drains.describe(s, row)}): nothing new is placed there",
                           field="to", node=to, hint="move it to another node; `tidal nodes` lists them")
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
        _refuse_unfit_move(s, job, [DeviceRef(n, i) for n, i in moved])
        job.target = moved
        checkpoint(s, job, "migrate", cause)
        return to
    # A job pinned to D devices (``tidal resize``) moves onto D devices, its ranks packed as they were.
    need = job.pinned_devices or job.ranks
    here = set(nodes_of(job.placement))
    if to is not None:
        own = [int(p["device"]) for p in current if p["node"] == to]
        room = sorted(free[to] + own)
        if to in here and len(here) == 1:
            raise Conflict(f"job {job.id} already runs on {to}", field="to", node=to)
        if len(room) < need:
            raise Conflict(f"node {to} has {len(room)} free device(s); job {job.id} needs {need}",
                           field="to", node=to)
        devices = [DeviceRef(to, i) for i in room[:need]]
    else:
        # Every rank onto a device the job does not hold: other nodes first; one node if one fits (the
        # fullest, so whole nodes stay free for large gangs), else as few nodes as possible.
        others = {n: idx for n, idx in free.items() if n not in here}
        fits = sorted((len(idx), n) for n, idx in others.items() if len(idx) >= need)
        if fits:
            devices = [DeviceRef(fits[0][1], i) for i in others[fits[0][1]][:need]]
        else:
            devices = []
            for n, idx in sorted(free.items(), key=lambda kv: (kv[0] in here, -len(kv[1]), kv[0])):
                devices += [DeviceRef(n, i) for i in idx[: need - len(devices)]]
            if len(devices) < need:
                raise Conflict(f"no other node has room for job {job.id}: it needs {need} device(s) it does "
                               f"not hold, {len(devices)} are free", hint="free some devices or add a node")
    target = list(rank_map(tuple(devices), job.ranks))
    _refuse_unfit_move(s, job, target)
    job.target = [[d.node, d.index] for d in target]
    checkpoint(s, job, "migrate", cause)
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


def resize(s: Session, job: JobRow, devices: int | None, cause: str) -> dict[str, Any]:
    """``tidal resize``: run the job's W ranks on ``devices`` devices (a consistent cut, a checkpoint of
    every rank, a restore with the new packing), and pin that number until ``devices=None`` (``--auto``)
    gives it back to the scheduler."""
    st = state(job)
    spec = spec_of(job)
    lo, hi = spec.min_devices or 1, spec.max_devices or job.ranks
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
        raise Conflict(f"job {job.id} is busy ({busy(job)}); try again in a moment", job=job.id, busy=True)
    if job.op is not None:
        raise Conflict(f"job {job.id} is busy ({busy(job)}); try again in a moment", job=job.id, busy=True)
    now = device_count(job)
    if devices == now:
        job.pinned_devices = devices
        record(s, "resize_pinned", job_id=job.id, cause=cause, detail=f"stays on {devices} device(s), pinned")
        return {"devices": devices, "pinned": True}
    own = [DeviceRef(p["node"], int(p["device"])) for p in job.placement]
    target = pack(free_devices(s, schedulable=True), own, job.ranks, devices)
    if target is None:
        raise Conflict(f"there is no room for job {job.id} on {devices} devices", field="devices",
                       hint="it goes on running as it was; free some devices or add a node")
    unfit = gpu_misfits(s, job, target)
    if unfit:
        raise Conflict(gpufit.describe(job.id, devices, unfit), field="devices",
                       hint=_fit_hint(job, unfit, now, hi))
    job.pinned_devices = devices
    resize_to(s, job, target, cause, why=f"from {now} to {devices} device(s), pinned by its owner")
    return {"devices": devices, "pinned": True}


def gpu_misfits(s: Session, job: JobRow, target: list[DeviceRef]) -> list[gpufit.Misfit]:
    """The GPUs of ``target`` whose memory the job's ranks there would not fit in, by the most GPU memory a
    rank of the job was last seen to use (its progress' ``gpu_rank_bytes``); empty when it was never
    measured or the target has no GPU."""
    rank_bytes = (job.progress or {}).get("gpu_rank_bytes")
    if not rank_bytes:
        return []
    gpus = {}
    for node in s.scalars(select(NodeRow).where(NodeRow.name.in_({d.node for d in target}))):
        for i, g in enumerate(node.gpus or ()):  # device i's GPU
            gpus[DeviceRef(node.name, i)] = gpufit.GpuMemory(str(g["model"]), int(g["memory_bytes"]))
    return gpufit.misfits(target, int(rank_bytes), gpus)


def _refuse_unfit_move(s: Session, job: JobRow, target: list[DeviceRef]) -> None:
    """A move (``tidal migrate``) onto GPUs too small for the job's ranks there is refused, the job untouched."""
    unfit = gpu_misfits(s, job, target)
    if unfit:
        raise Conflict(gpufit.describe(job.id, len(set(target)), unfit), field="to",
                       hint="move it to GPUs with more memory, or resize it onto more devices first; it goes on "
                            "running as it was")


def _fit_hint(job: JobRow, unfit: list[gpufit.Misfit], now: int, hi: int) -> str:
    """What the owner of a job refused for its GPU memory can ask instead: the fewest devices on which its
    ranks fit, on GPUs as small as the smallest refused."""
    small = min(unfit, key=lambda m: m.memory_bytes)
    per = gpufit.ranks_per_gpu(small.rank_bytes, small.memory_bytes)
    fewest = gpufit.fewest_devices(job.ranks, small.rank_bytes, small.memory_bytes)
    gpu = f"a GPU of {size(small.memory_bytes)}"
    if fewest is None:
        what = f"one of its ranks alone needs more than {gpu}"
    else:
        what = (f"no two of its ranks fit together on {gpu}" if per == 1
                else f"at most {per} of its ranks fit together on {gpu}")
        if fewest > hi:
            what += f", so it needs {fewest} devices, more than its {hi} at most"
        elif fewest == now:
            what += f", so it needs the {now} devices it runs on"
        else:
            what += f", so it needs at least {fewest} devices (`tidal resize {job.id} --devices {fewest}`)"
    return f"{what}; it goes on running as it was"


def resize_to(s: Session, job: JobRow, target: list[DeviceRef], cause: str | None, why: str) -> None:
    """Move the job to ``target`` (rank → device, D distinct devices) through a checkpoint."""
    job.target = [[d.node, d.index] for d in target]
    record(s, "resize", job_id=job.id, cause=cause, detail=why)
    checkpoint(s, job, "resize", cause)


def cancel(s: Session, job: JobRow, cause: str) -> None:
    st = state(job)
    if st in TERMINAL:
        raise Conflict(f"job {job.id} has already {job.state}", job=job.id, state=job.state)
    for node in {p["node"] for p in job.placement}:
        kill(s, job, node, cause)
    transition(s, job, S.CANCELLED, cause)


def _nodes_in(s: Session, region: str | None, cluster: str | None, *, check: bool = True) -> set[str]:
    """The nodes of ``region`` and ``cluster`` (either may be None: any); with ``check``, NotFound when no
    node was ever in the one asked for."""
    rows = list(s.scalars(select(NodeRow)))
    for kind, name in (("region", region), ("cluster", cluster)):
        if check and name is not None and not any(getattr(r, kind) == name for r in rows):
            known = sorted({getattr(r, kind) for r in rows})
            raise NotFound(f"no {kind} {name}", field=kind, hint=f"the {kind}s are: {', '.join(known)}")
    return {r.name for r in rows if region in (None, r.region) and cluster in (None, r.cluster)}
