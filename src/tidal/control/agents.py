"""What the control plane does for node agents: registration and leases, handing out actions, and
taking their results, exit reports and log bytes.

Fencing: a node's lease belongs to one agent process (``agent_id``). Another process may take the node
over only once that lease has expired, and the node's jobs are requeued at that moment, never before; an
agent whose lease was lost is told so at its next heartbeat and kills its ranks itself.

An agent that cannot reach the control plane (a partition) would hear nothing, so it fences itself
(:mod:`tidal.agent.lease`): it kills its ranks at ``sent + lease - margin``, where ``sent`` is when it sent
its last acknowledged heartbeat or registration and ``margin = max(0.5 s, lease / 4)``. A request is
received after it is sent, and the lease here runs ``lease`` from when it was received (``lease_until``),
so the agent has fenced at least ``margin`` before ``lease_until``, and the reconcile loop requeues only
after ``lease_until``: there is no extra grace here, the margin is that grace, kept on the agent's side,
which knows how long killing its ranks takes. This holds while both clocks run at the same rate (the agent
counts monotonic time; ``lease_until`` is wall time here: a jump of this host's clock forward by more than the
margin would shorten a lease, as it would without self-fencing). :func:`tidal.control.server.recover` gives
every node a fresh lease after a restart: that only lengthens leases, so an agent that fenced during the
outage has simply fenced early; it registers as a new agent once the lease it held runs out.

What crosses the network is :mod:`tidal.core.protocol`: actions are handed out as protocol actions, an
agent's result data is checked against the order's result model before it is applied, and exit reports
are typed rank exits. Time is read through the session (:mod:`tidal.control.clock`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, tuple_, update
from sqlalchemy.orm import Session

from tidal.config import load_settings
from tidal.control import checkpointing, clock, drains, failures, jobs, operations, prestaging
from tidal.control.history import record
from tidal.control.store.models import ActionRow, JobRow, NodeRow
from tidal.core import limits, protocol
from tidal.core.operations import Phase
from tidal.errors import Conflict, LeaseLost, NotFound, ValidationError

log = logging.getLogger(__name__)


def register(s: Session, *, name: str, region: str, cluster: str, devices: int, cpus: list[list[int]],
             agent_id: str, lease_s: float, advertise_addr: str | None = None,
             gpus: list[dict[str, Any]] | None = None) -> None:
    """Give the node's lease to ``agent_id`` (a new node is added). ``gpus``: its devices' GPUs, device index →
    ``{"index", "uuid", "model", "memory_bytes"}``, where its devices are GPUs (None: CPU devices)."""
    now = clock.now(s)
    node = s.get(NodeRow, name)
    if node is not None and node.agent_id != agent_id and node.up and node.lease_until > now:
        raise Conflict(f"node {name} is held by another agent for {node.lease_until - now:.1f}s more",
                       hint="retry once its lease has expired", retry_after=node.lease_until - now)
    _within_limits(s, node, name, devices)
    elsewhere = s.scalar(select(NodeRow.region).where(NodeRow.up.is_(True), NodeRow.cluster == cluster,
                                                      NodeRow.region != region, NodeRow.name != name).limit(1))
    if elsewhere is not None:
        # A cluster lies in one region: the scheduler's topology could not be built with it in two.
        raise Conflict(f"cluster {cluster} is in region {elsewhere}: node {name} cannot join it in region "
                       f"{region}", field="cluster", node=name,
                       hint="give the node's own cluster name (tidal agent --cluster), unique across regions")
    if node is None:
        node = NodeRow(name=name, region=region, cluster=cluster, devices=devices, cpus=cpus,
                       agent_id=agent_id, lease_until=now + lease_s, up=True, registered_at=now,
                       advertise_addr=advertise_addr, gpus=gpus)
        s.add(node)
    else:
        if node.up and node.agent_id != agent_id:
            expire(s, node, "its agent was replaced", lease_lost=True)
        node.region, node.cluster, node.devices, node.cpus = region, cluster, devices, cpus
        node.advertise_addr, node.gpus = advertise_addr, gpus
        node.agent_id, node.lease_until, node.up, node.registered_at = agent_id, now + lease_s, True, now
    kind = f" GPU(s) ({', '.join(sorted({g['model'] for g in gpus}))})" if gpus else " device(s)"
    record(s, "node_up", node=name, cause=agent_id, detail=f"{devices}{kind} in {region}/{cluster}")


def _within_limits(s: Session, node: NodeRow | None, name: str, devices: int) -> None:
    """The cluster's size stays bounded: what the control plane builds per node and per device (free
    device sets, the policy's view) grows with it."""
    if node is None and (s.scalar(select(func.count()).select_from(NodeRow)) or 0) >= limits.MAX_NODES:
        raise Conflict(f"the control plane knows {limits.MAX_NODES} nodes, the most it takes: node {name} "
                       "was not registered", field="name", node=name,
                       hint="register it under the name of a node the control plane knows, or remove nodes")
    others = select(func.coalesce(func.sum(NodeRow.devices), 0)).where(NodeRow.up.is_(True), NodeRow.name != name)
    if int(s.scalar(others) or 0) + devices > limits.MAX_CLUSTER_DEVICES:
        raise Conflict(f"node {name}'s {devices} device(s) would take the cluster over "
                       f"{limits.MAX_CLUSTER_DEVICES} devices", field="devices", node=name,
                       hint="start its agent with fewer --devices, or once other nodes have left")


def over_limits(node: NodeRow) -> str | None:
    """Why a node registered before its registration was checked cannot be kept, or None."""
    if not 1 <= node.devices <= limits.MAX_DEVICES_PER_NODE or len(node.cpus or ()) != node.devices:
        return f"its {node.devices} device(s) and {len(node.cpus or ())} CPU set(s) are over Tidal's limits"
    return None


def remove(s: Session, name: str) -> dict[str, Any]:
    """Forget a node that is down (its lease ran out: its jobs were requeued). A node still up is kept until
    its lease runs out (its agent, its credential revoked, stops at its next call): removing it earlier
    would requeue its jobs while its ranks may still run. What happened: ``removed``, and while the node is
    up, ``lease_left_s``."""
    node = s.get(NodeRow, name)
    if node is None:
        return {"removed": False, "known": False}
    now = clock.now(s)
    if node.up and node.lease_until > now:
        return {"removed": False, "known": True, "up": True, "lease_left_s": round(node.lease_until - now, 1)}
    if node.up:
        expire(s, node, "lease expired")
    s.delete(node)
    record(s, "node_removed", node=name, cause="api")
    return {"removed": True, "known": True}


def holder(s: Session, name: str, agent_id: str) -> NodeRow:
    node = s.get(NodeRow, name)
    if node is None:
        raise NotFound(f"no node {name}", node=name, hint="the node's agent registers it first")
    if node.agent_id != agent_id or not node.up:
        raise LeaseLost(f"agent {agent_id} does not hold node {name}", node=name,
                        hint="stop the node's ranks and register again")
    return node


def heartbeat(s: Session, name: str, agent_id: str, lease_s: float,
              progress: dict[str, dict[str, float]] | None = None) -> None:
    """Renew the node's lease for the agent that holds it (else :class:`LeaseLost`, or :class:`NotFound`: nothing
    written), and take what it says of its jobs. The renewal is one UPDATE that matches only the holder: hundreds
    of nodes heartbeat every second."""
    now = clock.now(s)
    if (name, agent_id) not in s.info.get(RENEWED, ()):  # not renewed with its batch (renew_leases)
        renewed = s.execute(update(NodeRow).where(
            NodeRow.name == name, NodeRow.agent_id == agent_id, NodeRow.up.is_(True)).values(
            lease_until=now + lease_s, lease_renewals=func.coalesce(NodeRow.lease_renewals, 0) + 1))
        if not cast(CursorResult[Any], renewed).rowcount:
            holder(s, name, agent_id)  # says why: no such node, or another agent holds it
    for job_id, p in (progress or {}).items():
        job = s.get(JobRow, job_id)
        # Only the node's own jobs: a node's figures must not land in (and grow) another job's progress.
        if (job is not None and job.attempt == int(p.get("attempt", -1))
                and any(q["node"] == name for q in job.placement)):
            job.progress = merge_progress(job, name, {k: v for k, v in p.items() if k != "attempt"}, now)
            _check_stalled(s, job, now)


def _check_stalled(s: Session, job: JobRow, now: float) -> None:
    """A distributed job whose ranks make no step and no collective for ``stall_after`` seconds is made
    visible once (an event; `tidal show`): it may hang, holding its devices."""
    prog = job.progress or {}
    still = prog.get("still_since")
    if still is None or prog.get("stalled"):
        return
    after = load_settings().stall_after
    if now - float(still) >= after:
        job.progress = {**prog, "stalled": True}
        record(s, "stalled", job_id=job.id,
               detail=f"no step and no collective for {now - float(still):.0f}s (at {prog.get('steps', 0)} steps, "
                      f"{prog.get('collectives', 0)} collectives): its ranks may be waiting on each other; "
                      f"`tidal logs {job.id} --rank R` shows what each printed last")


def merge_progress(job: JobRow, node: str, mine: dict[str, float], now: float) -> dict[str, Any]:
    """A job over several nodes: each agent reports its ranks; the job's figures are their sum (steps and
    collectives: the furthest rank; steps/s: the slowest node, which paces a synchronous job; GPU memory of
    one rank: the largest on any node)."""
    here = {p["node"] for p in job.placement}
    nodes = {n: v for n, v in ((job.progress or {}).get("nodes") or {}).items() if n in here} | {node: mine}
    out: dict[str, Any] = {"time": now, "nodes": nodes}
    for key in ("cpu_s", "rss_bytes", "output_bytes"):
        out[key] = round(sum(float(v.get(key, 0)) for v in nodes.values()), 2)
    for key in ("copy_to_go_bytes", "copy_total_bytes"):  # a restore's replication from another region
        if any(key in v for v in nodes.values()):
            out[key] = sum(int(v.get(key, 0)) for v in nodes.values())
    for key in ("steps", "collectives", "gpu_rank_bytes"):
        if any(key in v for v in nodes.values()):
            out[key] = max(int(v[key]) for v in nodes.values() if key in v)
    for key in ("steps_per_s", "collectives_per_s"):
        rates = [float(v[key]) for v in nodes.values() if key in v]
        if rates:
            out[key] = min(rates)
    # Since when the furthest rank has made neither a step nor a collective (stalled: see _check_stalled).
    prev = job.progress or {}
    if "collectives" in out:
        same = (prev.get("steps"), prev.get("collectives")) == (out.get("steps"), out["collectives"])
        out["still_since"] = prev.get("still_since", now) if same else now
        if same and prev.get("stalled"):
            out["stalled"] = True
    return out


def expire(s: Session, node: NodeRow, why: str, *, lease_lost: bool = False) -> None:
    """The node's agent is gone (and its ranks with it): requeue its jobs, without counting a restart (nothing
    of theirs failed). ``lease_lost``: its agent lost the lease (it ran out, or another agent took the node
    over), which counts towards draining the node (:mod:`tidal.control.drains`); an agent that stopped does not."""
    node.up = False
    eid = record(s, "node_down", node=node.name, cause=node.agent_id, detail=why)
    if lease_lost:
        drains.lease_lost(s, node, clock.now(s), eid)
    for a in s.scalars(select(ActionRow).where(ActionRow.node == node.name,
                                              ActionRow.status.in_(("pending", "sent")))):
        a.status = "dropped"
    for job in s.scalars(select(JobRow).where(JobRow.state.in_([st.value for st in jobs.ACTIVE]))):
        if any(p["node"] == node.name for p in job.placement):
            failures.lost(s, job, eid, f"node {node.name} lost ({why})", restart=False)
        elif any(n == node.name for n, _ in job.target or ()):
            # Only the migration's destination is gone: the ranks still run (and are being checkpointed)
            # where they are, so they must not be requeued; the job lands wherever there is room instead.
            job.target = []
            record(s, "migration_target_lost", job_id=job.id, node=node.name, cause=eid)
            if jobs.phase(job) is Phase.PRECOPY:  # its pre-copy there will not answer: go on without it
                prestaging.precopied(s, job, eid)


def take_actions(s: Session, name: str, agent_id: str) -> list[dict[str, Any]]:
    """The node's pending actions, oldest first, as protocol actions; from now on they are ``sent``."""
    holder(s, name, agent_id)
    out = []
    for a in s.scalars(select(ActionRow).where(ActionRow.node == name, ActionRow.status == "pending")
                       .order_by(ActionRow.created_at)):
        a.status = "sent"
        a.agent_id = agent_id
        out.append(_action(a))
    return out


def _action(a: ActionRow) -> dict[str, Any]:
    """An action row as the agent receives it. The row's ``kind`` is the order's (rows written before the
    payload held it lack it there). An order this control plane cannot read (written by another release,
    or damaged) is handed out as it is stored: the agent refuses it and reports why as the action's failed
    result, which settles the job's operation like any failure."""
    order = {**a.payload, "kind": a.kind}
    try:
        return protocol.encode(protocol.Action(id=a.id, order=protocol.decode_order(order)))
    except ValidationError as exc:
        log.warning("action %s (%s of job %s) is not a valid order here: %s; the agent will refuse it", a.id,
                    a.kind, a.job_id, exc)
        return {"v": protocol.VERSION, "id": a.id, "order": order}


RENEWED = "renewed_leases"  # Session.info: the (node, agent) pairs whose lease renew_leases renewed


def renew_leases(s: Session, holders: list[tuple[str, str]], lease_s: float) -> None:
    """Renew in one statement the leases of the nodes whose agents (``holders``: (node, agent id)) heartbeat
    together: each where that agent holds it. :func:`heartbeat` then renews none of these again, and finds the
    others refused."""
    now = clock.now(s)
    renewed: set[tuple[str, str]] = set()
    # Each heartbeat counts as a renewal: an agent's several heartbeats in one batch (one statement for each such
    # count, nearly always just the one).
    by_count: dict[int, list[tuple[str, str]]] = {}
    for pair, n in Counter(holders).items():
        by_count.setdefault(n, []).append(pair)
    for n, pairs in by_count.items():
        stmt = (update(NodeRow).where(tuple_(NodeRow.name, NodeRow.agent_id).in_(pairs), NodeRow.up.is_(True))
                .values(lease_until=now + lease_s, lease_renewals=func.coalesce(NodeRow.lease_renewals, 0) + n)
                .returning(NodeRow.name, NodeRow.agent_id).execution_options(synchronize_session=False))
        renewed |= {(name, agent) for name, agent in s.execute(stmt)}
    s.info[RENEWED] = renewed


def holds(s: Session, name: str, agent_id: str) -> None:
    """:func:`holder`'s check without loading the node (two columns): a long-poll asks it at every wake."""
    row = s.execute(select(NodeRow.agent_id, NodeRow.up).where(NodeRow.name == name)).first()
    if row is None or row.agent_id != agent_id or not row.up:
        holder(s, name, agent_id)


def has_actions(s: Session, name: str) -> bool:
    return s.scalar(select(ActionRow.id).where(ActionRow.node == name, ActionRow.status == "pending")
                    .limit(1)) is not None


def result(s: Session, name: str, agent_id: str, action_id: str, ok: bool, data: dict[str, Any],
           error: str | None, keep: int) -> bool:
    """Apply an action's result; False (and an event) when it is stale: unknown, already settled,
    dropped, or sent to another agent process. ``data`` must be the result of the action's kind of order
    (:func:`tidal.core.protocol.result_of`; a :class:`~tidal.core.protocol.Failure` when not ``ok``): else a
    ValidationError naming the field, and nothing is applied."""
    a = s.get(ActionRow, action_id)
    if a is None or a.status != "sent" or a.agent_id != agent_id or a.node != name:
        why = ("unknown action" if a is None else f"action is {a.status}" if a.status != "sent"
               else "wrong agent")
        record(s, "stale_result_ignored", job_id=a.job_id if a else None, node=name, cause=action_id,
               detail=why)
        return False
    data = protocol.encode(protocol.result_of(a.kind, ok, data))
    a.status = "done" if ok else "failed"
    a.done_at = clock.now(s)
    a.result = {"ok": ok, "error": error, **data}
    operations.on_result(s, a, data, keep)
    return True


def exited(s: Session, name: str, agent_id: str, job_id: str, attempt: int,
           ranks: Sequence[protocol.RankExit | dict[str, Any]], keep: int) -> bool:
    """Ranks of a job ended on their own (an exit report). ``ranks``: protocol rank exits (plain data is
    decoded as one). False when the job is unknown or the report stale."""
    holder(s, name, agent_id)
    typed = [r if isinstance(r, protocol.RankExit) else protocol.decode(protocol.RankExit, r, "rank exit")
             for r in ranks]
    job = s.get(JobRow, job_id)
    if job is None:
        return False
    bad = [r.rank for r in typed if not r.rank < job.ranks]
    if bad:
        raise ValidationError(f"ranks: job {job_id} has ranks 0..{job.ranks - 1}, not {bad[0]}", field="ranks",
                              hint="report only ranks of the job's current attempt")
    eid = record(s, "ranks_exited", job_id=job_id, node=name, cause=agent_id,
                 detail=f"attempt {attempt}: " + ", ".join(
                     f"rank {r.rank} " + (f"code {r.code}" if r.signal is None else f"signal {r.signal}")
                     for r in typed))
    return failures.on_exit(s, job, attempt, [protocol.encode(r) for r in typed], eid)


def commit_reported(s: Session, name: str, report: protocol.CommitReport, keep: int) -> bool:
    """The agent of node ``name`` reports the end of a commit it answered before (see
    :func:`checkpointing.commit_reported`)."""
    holder(s, name, report.agent_id)
    return checkpointing.commit_reported(s, report.job_id, report.checkpoint_id, report.ok, report.bytes,
                                         report.stored_bytes, report.error, name, keep)


def log_path(home: Path, job_id: str, rank: int) -> Path:
    return home / "logs" / "jobs" / job_id / f"{rank}.log"


def write_log(s: Session, home: Path, name: str, agent_id: str, job_id: str, attempt: int, rank: int,
              offset: int, data: bytes) -> bool:
    """Write ``data`` at ``offset`` of the rank's log and cut it there: the agent sends each attempt's log
    from its start, so a restore from an older checkpoint rolls the served log back with it."""
    holder(s, name, agent_id)
    job = s.get(JobRow, job_id)
    if job is None or job.attempt != attempt:
        return False
    if not 0 <= rank < job.ranks:
        raise ValidationError(f"rank: job {job_id} has ranks 0..{job.ranks - 1}, not {rank}", field="rank",
                              hint="send the log of one of the job's ranks")
    path = log_path(home, job_id, rank)
    # Owner-only whatever the process's umask: a job's output may hold its secrets.
    (home / "logs").mkdir(exist_ok=True, mode=0o700)
    path.parent.parent.mkdir(exist_ok=True, mode=0o700)
    path.parent.mkdir(exist_ok=True, mode=0o700)
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.truncate(offset + len(data))
    return True
