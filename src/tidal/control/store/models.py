"""Tables of the control plane. Spec, instance state and history are kept apart: ``jobs.spec`` is the
user's request (never changed), the other job columns are the live state, ``events`` the history."""

from __future__ import annotations

import enum
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Enum, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tidal.core.operations import Phase


class Base(DeclarativeBase):
    pass


class User(Base):
    """An account: its role, the Unix account its jobs run as, and the limits an admin set for it (``limits``:
    limit → a number, or None for no limit; a limit not there is the default: :mod:`tidal.control.userlimits`).
    Its API tokens are :class:`UserToken` rows."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | user | agent | metrics
    unix_user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    limits: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")


class UserToken(Base):
    """An API token of a user: only its sha256 is kept. ``id`` names it (shown, listed, revoked by; not a
    secret). It works until ``expires_at`` (None: no end) unless revoked; ``ttl_s`` is the time to live it was
    given (a rotation gives the new token the same). ``last_used_at`` is updated at most once a minute."""

    __tablename__ = "user_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    username: Mapped[str] = mapped_column(String(64), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    label: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ttl_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Project(Base):
    """A project jobs are submitted under (``tidal submit --project``): its members may submit under it
    (``default`` is open to every user). ``limits`` as a user's: the project's own, over all its jobs."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    limits: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")


class ProjectMember(Base):
    __tablename__ = "project_members"

    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    username: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    added_at: Mapped[float] = mapped_column(Float)


class JoinToken(Base):
    """A join token: lets the agent of one node (``node``) obtain that node's own credential, once, before
    ``expires_at``. Only its sha256 is kept; used and revoked tokens stay listed."""

    __tablename__ = "join_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # shown and revoked by; not a secret
    node: Mapped[str] = mapped_column(String(128), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    region: Mapped[str] = mapped_column(String(64))
    cluster: Mapped[str] = mapped_column(String(64))
    devices: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[list[list[int]]] = mapped_column(JSON)  # device index → its CPU set
    agent_id: Mapped[str] = mapped_column(String(64))  # the agent process holding the lease
    lease_until: Mapped[float] = mapped_column(Float)
    up: Mapped[bool] = mapped_column(Boolean)
    registered_at: Mapped[float] = mapped_column(Float)
    # The address other nodes reach this one at (its ranks' rendezvous and collectives), as its agent
    # advertised it at registration (``--advertise-addr``); None: not given.
    advertise_addr: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Heartbeats that renewed the lease of the node's agents since the node was first registered (a counter
    # of the exported metrics: kept here, it survives restarts of the control plane).
    lease_renewals: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Device index → its GPU ({"index", "uuid", "model", "memory_bytes"}) on a node whose devices are NVIDIA GPUs
    # (``tidal agent --devices auto``); None on a node of CPU devices.
    gpus: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # When its lease was lost lately: the last few times only (tidal.control.drains), bounded.
    lease_losses: Mapped[list[float] | None] = mapped_column(JSON, nullable=True)
    # Drained (it takes nothing new; its jobs run on): "lease" (its lease kept being lost) or "admin"; None: not.
    drain: Mapped[str | None] = mapped_column(String(16), nullable=True)
    drain_reason: Mapped[str | None] = mapped_column(String(512), nullable=True)
    drained_by: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the admin's name
    drained_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobRow(Base):
    __tablename__ = "jobs"
    # A user's jobs in a state (their waiting jobs, counted against their limit at each submission).
    __table_args__ = (Index("ix_jobs_owner_state", "owner", "state"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, index=True)  # submission order
    name: Mapped[str] = mapped_column(String(256))
    owner: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    tier: Mapped[str] = mapped_column(String(16))
    ranks: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Device-seconds its ranks ran before ``started_at`` (folded in as each run ends): the service the policy
    # orders basic work by, and what a job that gave its run time has done of it.
    attained_device_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # The cluster it was last placed in (its checkpoint's, for the scheduler's preference on resuming it).
    last_cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped at every launch or restore: reports from an older attempt are stale and ignored.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # [{"rank", "node", "device", "pid"}] while the job holds devices, else [].
    placement: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # The devices a migration will restore onto ([[node, index], ...]): reserved while it runs.
    target: Mapped[list[list[Any]] | None] = mapped_column(JSON, nullable=True)
    op: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the action in flight
    op_purpose: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_checkpoint_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What the agents last saw of the ranks: {"time", "cpu_s", "rss_bytes", "output_bytes", "steps", ...}.
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The phase of the job's operation in flight (tidal.core.operations: an invalid step raises).
    phase: Mapped[Phase] = mapped_column(
        Enum(Phase, native_enum=False, length=16, validate_strings=True, create_constraint=True,
             name="job_phase", values_callable=lambda e: [m.value for m in e]),
        default=Phase.IDLE, server_default=Phase.IDLE.value)
    # What the operation's steps carry from one to the next (checkpoint id, cut epoch and target, parts,
    # rendezvous, the outcome so far), else None.
    opstate: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Ranks of the current attempt that have exited: {rank: {"code", "signal", "at", "stopped"}}.
    exited: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Devices D set by ``tidal resize``: the scheduler leaves D alone until ``--auto`` clears it.
    pinned_devices: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The checkpoint the job resumes from next (``tidal resume --from``, or the one it fell back to from a
    # damaged one) instead of its newest; cleared once it commits a newer one.
    resume_from: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Why the job waits (the policy's reason, tidal.policy.reasons: its code and its text), while it waits;
    # None while it runs or is done, and until the scheduler's next pass has looked at it.
    reason_code: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class ActionRow(Base):
    __tablename__ = "actions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # launch | restore | checkpoint | cut | finish | kill
    op: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)  # one per node of an operation
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)  # pending | sent | done | failed | dropped
    agent_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # who it was sent to
    cause: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    done_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class EventRow(Base):
    __tablename__ = "events"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(32), unique=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    node: Mapped[str | None] = mapped_column(String(128), nullable=True)
    cause: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")


class CheckpointState(enum.Enum):
    COMMITTED = "committed"  # every part is stored: it may be restored
    BAD = "bad"  # failed verification on restore: kept for inspection, never restored nor retired again
    # Dumped on its node, which restored the job from those images; its commit to the store under way: no
    # checkpoint to fall back to until its agent reports it committed (then COMMITTED; else it is removed).
    COMMITTING = "committing"


class CheckpointRow(Base):
    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    bytes: Mapped[int] = mapped_column(BigInteger)  # logical size of the images and files
    stored_bytes: Mapped[int] = mapped_column(BigInteger)  # new bytes the store had to write
    parts: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # store checkpoints, one per node
    # The regions whose store holds every part (its nodes', then those it was replicated to); None: taken
    # when every region shared one store.
    regions: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    retained: Mapped[bool] = mapped_column(Boolean, default=True)
    state: Mapped[CheckpointState] = mapped_column(
        Enum(CheckpointState, native_enum=False, length=16, validate_strings=True, create_constraint=True,
             name="checkpoint_state", values_callable=lambda e: [m.value for m in e]),
        default=CheckpointState.COMMITTED, server_default=CheckpointState.COMMITTED.value)


class MetricRow(Base):
    """A series of the exported counters and histograms (:mod:`tidal.control.tally`), folded from the event
    log: ``data`` is ``{"v": value}`` for a counter, ``{"b": [count per bucket], "s": sum, "c": count}`` for a
    histogram. The row named ``_folded`` holds the sequence number of the last event folded (``{"seq"}``)."""

    __tablename__ = "metric_series"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    labels: Mapped[str] = mapped_column(String(512), primary_key=True)  # canonical JSON of the label values
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class MetricJobRow(Base):
    """What the fold of the event log keeps of a job between events: when the job's open intervals began
    (``open``: a checkpoint, a restore, a migration), how long it has run, and for the SLA attainment its
    tier, ranks and times. Kept while the job lives and for the SLA window after it ends."""

    __tablename__ = "metric_jobs"

    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tier: Mapped[str] = mapped_column(String(16))
    ranks: Mapped[int] = mapped_column(Integer)
    submitted_at: Mapped[float] = mapped_column(Float)
    started: Mapped[bool] = mapped_column(Boolean, default=False)
    run_s: Mapped[float] = mapped_column(Float, default=0.0)  # time in state running, closed intervals
    running_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    open: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class RegionLinkRow(Base):
    """The measured link from one region's checkpoint store to another's (:mod:`tidal.control.linkrates`): the
    last copies between them large enough to time, each ``[stored bytes, seconds]``, oldest first."""

    __tablename__ = "region_links"

    source: Mapped[str] = mapped_column(String(64), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    samples: Mapped[list[list[float]]] = mapped_column(JSON)
    copies: Mapped[int] = mapped_column(Integer)  # copies timed in all (``samples`` keeps the last few)
    updated_at: Mapped[float] = mapped_column(Float)
