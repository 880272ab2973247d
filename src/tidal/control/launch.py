"""Starting a job's ranks: a launch from scratch, or a restore from the checkpoint it resumes from, over
one node or several; and what the agents' answers do to the job."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from tidal.control import failures, linkrates
from tidal.control.clock import now
from tidal.control.dispatch import kill, new_action
from tidal.control.history import new_id, record
from tidal.control.jobs import parts_of, restore_source, set_phase, spec_of, state, transition
from tidal.control.regionstores import replicated, source_for, store_region
from tidal.control.rendezvous import rendezvous
from tidal.control.store.models import ActionRow, CheckpointRow, JobRow, NodeRow, User
from tidal.core import DeviceRef, JobState, protocol
from tidal.core.operations import Phase
from tidal.core.units import size
from tidal.errors import Conflict

S = JobState


def start(s: Session, job: JobRow, devices: list[DeviceRef], cause: str | None,
          source: CheckpointRow | None = None) -> None:
    """Launch the job on ``devices`` (rank r on ``devices[r]``, over one node or several), or restore it
    there from the checkpoint it resumes from (:func:`restore_source`) when it has one. ``source``: restore
    from this one instead (a checkpoint still being committed, on the node that dumped it)."""
    if len(devices) != job.ranks:
        raise Conflict(f"job {job.id} has {job.ranks} rank(s), placement gives {len(devices)} device(s)",
                       job=job.id)
    source = source or restore_source(s, job)
    how = f"restoring from checkpoint {source.id}" if source is not None else "launching"
    by_node: dict[str, list[tuple[int, DeviceRef]]] = {}
    for r, d in enumerate(devices):
        by_node.setdefault(d.node, []).append((r, d))
    where = "; ".join(f"{n} devices {[d.index for _, d in rs]}" for n, rs in by_node.items())
    job.placement = [{"rank": r, "node": d.node, "device": d.index, "pid": None}
                     for r, d in enumerate(devices)]
    job.target = None
    first = s.get(NodeRow, devices[0].node)
    job.last_cluster = first.cluster if first is not None else job.last_cluster
    transition(s, job, S.RUNNING if state(job) is S.PENDING else S.RESTORING, cause, f"on {where}, {how}")
    set_phase(job, Phase.STARTING)
    job.attempt += 1
    job.exited = {}
    job.opstate = None
    spec = spec_of(job)
    owner = s.get(User, job.owner)
    rdv = rendezvous(s, job, "start")
    first = s.get(NodeRow, devices[0].node)
    master = first.advertise_addr if first is not None else None
    op = new_id("o")
    for group_rank, (node, ranks) in enumerate(by_node.items()):
        noderow = s.get(NodeRow, node)
        cpus = noderow.cpus if noderow else []
        fields: dict[str, Any] = dict(
            job_id=job.id, attempt=job.attempt, argv=list(spec.command), workdir=spec.workdir, env=dict(spec.env),
            world_size=job.ranks, local_world_size=len(ranks), group_rank=group_rank, group_world_size=len(by_node),
            # The ranks run under the owner's Unix account (the agent drops to it inside the rank).
            unix_user=owner.unix_user if owner else None,
            ranks=[protocol.RankSlot(rank=r, local_rank=i, device=d.index,
                                     cpus=cpus[d.index] if d.index < len(cpus) else None)
                   for i, (r, d) in enumerate(ranks)],
            rendezvous=rdv,
            fs=any(r == 0 for r, _ in ranks),  # the node of rank 0 keeps the working directory
            master_addr=master,
            torchrun=spec.torchrun,
        )
        order: protocol.Order = (protocol.Launch(**fields) if source is None else protocol.Restore(
            **fields, checkpoint=protocol.CheckpointRef(
                id=source.id, parts=parts_of(source),
                source=source_for(s, source, noderow.region) if noderow else None)))
        new_action(s, job, node, order, cause, op=op)
    job.op_purpose = "restore" if source is not None else "launch"


def started(s: Session, job: JobRow, kind: str, group: list[ActionRow], failed: list[ActionRow], err: str,
            cause: str) -> None:
    """Every node has answered the launch or restore."""
    set_phase(job, Phase.IDLE)
    job.op_purpose = None
    if failed:
        for g in group:  # the nodes where it did start must not keep half a job running
            if g.status == "done":
                kill(s, job, g.node, cause)
        if kind == "restore":
            damaged = [(g.node, c) for g in failed if (c := (g.result or {}).get("corrupt"))]
            if damaged and failures.fall_back(s, job, group[0], damaged, cause):
                return
            # The store its checkpoint was to be copied from did not answer: an older one held elsewhere, if any.
            away = [(g.node, u) for g in failed if (u := (g.result or {}).get("unreachable"))]
            if away and failures.restore_elsewhere(s, job, group[0], away, cause):
                return
            # Possibly transient (a node's disk, the store): try again, from the same checkpoint, as a restart.
            failures.lost(s, job, cause, f"restore failed ({err})", stop_others=False)
            return
        job.error = err
        transition(s, job, S.FAILED, cause, f"{kind} failed: {err}")
        return
    if kind == "restore":
        _replicated(s, job, group, cause)
    pids = {int(r["rank"]): r["pid"] for g in group for r in (g.result or {}).get("ranks", [])}
    job.placement = [{**p, "pid": pids.get(int(p["rank"]))} for p in job.placement]
    job.started_at = now(s)
    detail = f"pids {[pids.get(r) for r in range(job.ranks)]}"
    if state(job) is S.RESTORING:
        transition(s, job, S.RUNNING, cause, f"restored, {detail}")
    else:
        record(s, "started", job_id=job.id, node=group[0].node, cause=cause, detail=detail)


def _replicated(s: Session, job: JobRow, group: list[ActionRow], cause: str) -> None:
    """The restore's nodes that replicated its checkpoint from another region's store first: the checkpoint
    is in their regions' stores now too, and the copy, timed, tells how fast the link between the regions is
    (:mod:`tidal.control.linkrates`)."""
    copied = [g for g in group if (g.result or {}).get("replicated_bytes") is not None]
    ck = s.get(CheckpointRow, str(group[0].payload["checkpoint"]["id"])) if copied else None
    if ck is None:
        return
    regions = {row.region for g in copied if (row := s.get(NodeRow, g.node)) is not None}
    source = ", ".join(ck.regions or ())
    came_from = store_region(s, ck, group[0].payload["checkpoint"].get("source"))
    replicated(s, ck, regions)
    nbytes = sum(int((g.result or {})["replicated_bytes"]) for g in copied)
    chunks = sum(int((g.result or {}).get("replicated_chunks") or 0) for g in copied)
    took = max(float((g.result or {}).get("replicated_s") or 0) for g in copied)
    record(s, "replicated", job_id=job.id, node=copied[0].node, cause=cause,
           detail=f"checkpoint {ck.id} copied from region {source} to {', '.join(sorted(regions))}: "
                  f"{chunks} chunk(s), {size(nbytes)} crossed in {took:.1f}s")
    if came_from is not None:
        for region in regions:
            here = [g for g in copied if (row := s.get(NodeRow, g.node)) is not None and row.region == region]
            linkrates.note(s, came_from, region, sum(int((g.result or {})["replicated_bytes"]) for g in here),
                           max(float((g.result or {}).get("replicated_s") or 0) for g in here))
