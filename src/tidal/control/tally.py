"""The exported counters and histograms, folded from the event log into the database.

Every change of a job is an event with its cause (:mod:`tidal.control.history`), so what the metrics count —
preemptions, migrations, resizes, restarts, checkpoints and their failures, queueing, pause, restore and
migration times, lost leases — is already recorded. :func:`fold` reads the events after the last one it
folded (by ``seq``, a bounded batch at a time), adds what they say to the series of ``metric_series`` and
moves its mark, in one transaction: the totals are the database's, so they stay right across restarts of
the control plane (and whichever process folds), each event is counted once, and a scrape reads a few
hundred rows however long the event log is. What the fold needs to remember of a job between events (when a
checkpoint began, how long the job has run) is its row of ``metric_jobs``, dropped once the job has ended
and left the SLA window.

The events are read as the control plane's modules write them: the kind is the job's new state, and the
details that tell a committed checkpoint from a failed one (:mod:`~tidal.control.checkpointing`), a restart
(:mod:`~tidal.control.failures`) or a finished restore (:mod:`~tidal.control.launch`) are matched here;
tests/integration/control/test_metrics.py drives each of those paths through the control plane.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.store.models import CheckpointRow, EventRow, JobRow, MetricJobRow, MetricRow
from tidal.core import JobState

S = JobState

#: Events folded per transaction (the writers' lock is held meanwhile): a scrape folds batches until it has
#: caught up or spent :data:`FOLD_BUDGET_S`.
FOLD_BATCH = 2000
FOLD_BUDGET_S = 1.0
#: How long an ended job still counts in the SLA attainment ("recently finished").
SLA_WINDOW_S = 3600.0
MARK = "_folded"

SECONDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
           21600.0, 86400.0)
MiB = 1 << 20
BYTES = tuple(float(MiB * 4**k) for k in range(11))  # 1 MiB … 1 TiB

#: Each histogram: its buckets' upper bounds (the last bucket, +Inf, is implicit).
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "tidal_job_queueing_seconds": SECONDS,
    "tidal_checkpoint_pause_seconds": SECONDS,
    "tidal_checkpoint_size_bytes": BYTES,
    "tidal_checkpoint_stored_bytes": BYTES,
    "tidal_restore_seconds": SECONDS,
    "tidal_migration_seconds": SECONDS,
}

_STATES = frozenset(st.value for st in S)
_TERMINAL = frozenset((S.SUCCEEDED.value, S.FAILED.value, S.CANCELLED.value))
_COMMITTED = re.compile(r"^checkpoint (\S+) \(")  # checkpointing._commit's detail
_PURPOSE = re.compile(r"^(\w+) checkpoint$")  # checkpointing.checkpoint's detail
_RESTART = re.compile(r"; restart \d+/\d+, ")  # failures.lost's detail when it counts a restart
_REQUEUE = re.compile(r"; requeued from .*, not counted as a restart")  # ... and when it does not


def labels_key(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


@dataclass
class Series:
    """The series of one fold: loaded once, changed in memory, written back."""

    rows: dict[tuple[str, str], MetricRow]
    changed: set[tuple[str, str]] = field(default_factory=set)

    def _row(self, name: str, labels: dict[str, str], empty: dict[str, Any]) -> tuple[tuple[str, str], MetricRow]:
        key = (name, labels_key(labels))
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = MetricRow(name=name, labels=key[1], data=empty)
        self.changed.add(key)
        return key, row

    def inc(self, name: str, labels: dict[str, str], by: float = 1.0) -> None:
        _, row = self._row(name, labels, {"v": 0.0})
        row.data = {"v": float(row.data.get("v", 0.0)) + by}

    def observe(self, name: str, labels: dict[str, str], value: float) -> None:
        bounds = HISTOGRAMS[name]
        _, row = self._row(name, labels, {"b": [0] * (len(bounds) + 1), "s": 0.0, "c": 0})
        buckets = list(row.data.get("b") or [0] * (len(bounds) + 1))
        i = next((k for k, b in enumerate(bounds) if value <= b), len(bounds))
        buckets[i] += 1
        row.data = {"b": buckets, "s": float(row.data.get("s", 0.0)) + value, "c": int(row.data.get("c", 0)) + 1}


def fold(s: Session, limit: int = FOLD_BATCH) -> int:
    """Fold up to ``limit`` events after the mark into the series; how many were folded."""
    series = Series({(r.name, r.labels): r for r in s.scalars(select(MetricRow))})
    mark_row = series.rows.get((MARK, ""))
    mark = int(mark_row.data.get("seq", 0)) if mark_row is not None else 0
    events = list(s.scalars(select(EventRow).where(EventRow.seq > mark).order_by(EventRow.seq).limit(limit)))
    if not events:
        return 0
    ids = {e.job_id for e in events if e.job_id}
    jobs = {j.job_id: j for j in s.scalars(select(MetricJobRow).where(MetricJobRow.job_id.in_(ids)))}
    new = {e.job_id for e in events if e.kind == "submitted" and e.job_id and e.job_id not in jobs}
    for j in s.scalars(select(JobRow).where(JobRow.id.in_(new))) if new else ():
        row = MetricJobRow(job_id=j.id, tier=j.tier, ranks=j.ranks, submitted_at=j.submitted_at, started=False,
                           run_s=0.0, running_since=None, finished_at=None, open={})
        s.add(row)
        jobs[j.id] = row
    folder = _Folder(series, jobs)
    for e in events:
        folder.apply(e)
    folder.checkpoint_sizes(s)
    series.rows[(MARK, "")] = mark_row or MetricRow(name=MARK, labels="", data={})
    series.rows[(MARK, "")].data = {"seq": events[-1].seq}
    series.changed.add((MARK, ""))
    for key in series.changed:
        s.merge(series.rows[key])
    # Ended jobs count in the SLA attainment for a while, then their rows go.
    s.execute(delete(MetricJobRow).where(MetricJobRow.finished_at < now(s) - SLA_WINDOW_S))
    return len(events)


def folded_seq(s: Session) -> int:
    row = s.get(MetricRow, (MARK, ""))
    return int(row.data.get("seq", 0)) if row is not None else 0


def series(s: Session) -> list[MetricRow]:
    """Every folded series (the mark excepted)."""
    return [r for r in s.scalars(select(MetricRow).order_by(MetricRow.name, MetricRow.labels)) if r.name != MARK]


class _Folder:
    """Applies events, in order, to the series and to what it keeps of each job."""

    def __init__(self, out: Series, jobs: dict[str, MetricJobRow]) -> None:
        self.out = out
        self.jobs = jobs
        self.committed: list[tuple[str, str, str]] = []  # (checkpoint id, tier, purpose) whose sizes to read

    def apply(self, e: EventRow) -> None:
        if e.kind == "node_down":
            self.out.inc("tidal_lease_losses_total", {"cause": _lease_loss(e.detail)})
            return
        if e.kind == "node_drained":
            self.out.inc("tidal_node_drains_total",
                         {"cause": "lease_losses" if (e.detail or "").startswith("lease lost") else "admin"})
            return
        j = self.jobs.get(e.job_id) if e.job_id else None
        if j is None:
            return
        tier = {"tier": j.tier}
        if e.kind == "submitted":
            self.out.inc("tidal_jobs_submitted_total", tier)
        elif e.kind == "checkpoint_bad":
            self.out.inc("tidal_checkpoints_bad_total", tier)
        if e.kind not in _STATES:
            return
        t = e.time
        opened = dict(j.open or {})
        if j.running_since is not None:  # every state event leaves the state before: running, maybe
            j.run_s = float(j.run_s or 0.0) + max(0.0, t - j.running_since)
            j.running_since = None
        ck = opened.pop("checkpoint", None) if e.kind != S.CHECKPOINTING.value else None
        if ck is not None:
            self._closed_checkpoint(e, tier, float(ck[0]), str(ck[1]), str(ck[2]), opened)
        if _RESTART.search(e.detail or ""):
            self.out.inc("tidal_restarts_total", {**tier, "cause": _restart_cause(e.detail)})
        elif _REQUEUE.search(e.detail or ""):
            self.out.inc("tidal_requeues_total", {**tier, "cause": _requeue_cause(e.detail)})
        kind = e.kind
        if kind == S.RUNNING.value:
            j.running_since = t
            if not j.started:
                j.started = True
                self.out.observe("tidal_job_queueing_seconds", tier, max(0.0, t - j.submitted_at))
            restore = opened.pop("restore", None)
            migrate = opened.pop("migrate", None)
            if (e.detail or "").startswith("restored"):
                if restore is not None:
                    self.out.observe("tidal_restore_seconds", tier, max(0.0, t - float(restore)))
                if migrate is not None:
                    self.out.observe("tidal_migration_seconds", tier, max(0.0, t - float(migrate)))
        elif kind == S.CHECKPOINTING.value:
            m = _PURPOSE.match(e.detail or "")
            who = "user" if (e.cause or "").startswith("api:") else "scheduler"
            opened["checkpoint"] = [t, m.group(1) if m else "other", who]
        elif kind == S.RESTORING.value:
            j.started = True  # a restore is a start, for the queueing time too (it was counted at the first)
            opened["restore"] = t
        elif kind in (S.PENDING.value, S.HELD.value):
            opened.pop("restore", None)
            opened.pop("migrate", None)
        elif kind in _TERMINAL:
            opened = {}
            j.finished_at = t
            self.out.inc("tidal_jobs_finished_total", {**tier, "state": kind})
        j.open = opened

    def _closed_checkpoint(self, e: EventRow, tier: dict[str, str], since: float, purpose: str, who: str,
                           opened: dict[str, Any]) -> None:
        """The event that ends a checkpoint: committed (its detail names the checkpoint), failed, or cut short
        by the job's end or loss."""
        detail = e.detail or ""
        m = _COMMITTED.match(detail)
        if m is None:
            if e.kind == S.RUNNING.value and "checkpoint failed" in detail:
                cause = "error"
            elif e.kind in _TERMINAL or detail.startswith("exited during"):
                return  # the job ended meanwhile: nothing failed
            else:
                cause = "job_lost"
            self.out.inc("tidal_checkpoint_failures_total", {**tier, "purpose": purpose, "cause": cause})
            return
        self.out.inc("tidal_checkpoints_total", {**tier, "purpose": purpose})
        self.out.observe("tidal_checkpoint_pause_seconds", {**tier, "purpose": purpose}, max(0.0, e.time - since))
        self.committed.append((m.group(1), tier["tier"], purpose))
        if e.kind == S.PREEMPTED.value:
            cause = ("migration_target_lost" if "destination is gone" in detail
                     else "user" if purpose == "hold" else "scheduler")
            self.out.inc("tidal_preemptions_total", {**tier, "cause": cause})
        elif e.kind == S.MIGRATING.value:
            name = "tidal_resizes_total" if purpose == "resize" else "tidal_migrations_total"
            self.out.inc(name, {**tier, "cause": who})
            if purpose == "migrate":
                opened["migrate"] = since

    def checkpoint_sizes(self, s: Session) -> None:
        """The sizes of the checkpoints committed in this batch, from their rows."""
        if not self.committed:
            return
        rows = {c.id: c for c in s.scalars(select(CheckpointRow).where(
            CheckpointRow.id.in_({ck for ck, _, _ in self.committed})))}
        for ck, tier, _ in self.committed:
            row = rows.get(ck)
            if row is not None:
                self.out.observe("tidal_checkpoint_size_bytes", {"tier": tier}, float(row.bytes))
                self.out.observe("tidal_checkpoint_stored_bytes", {"tier": tier}, float(row.stored_bytes))


def _lease_loss(detail: str | None) -> str:
    d = detail or ""
    if d.startswith("lease expired"):
        return "expired"
    if d.startswith("its agent stopped"):
        return "agent_left"
    if d.startswith("its agent was replaced"):
        return "agent_replaced"
    return "other"


def _restart_cause(detail: str | None) -> str:
    d = detail or ""
    if d.startswith("node ") and " lost" in d.split(";")[0]:
        return "node_lost"
    if d.startswith("restore failed"):
        return "restore_failed"
    if "killed by signal" in d.split(";")[0]:
        return "killed"
    return "other"


def _requeue_cause(detail: str | None) -> str:
    d = (detail or "").split(";")[0]
    if d.startswith("node ") and " lost" in d:
        return "node_lost"
    if d.startswith("checkpoint ") and d.endswith(" is damaged"):
        return "checkpoint_bad"
    if d.startswith("checkpoint ") and "cannot be reached" in d:
        return "store_unreachable"
    return "other"


@dataclass(frozen=True)
class JobTimes:
    """What the SLA attainment of one job is made of: its width W, T_ideal (time it ran) and T_real (from its
    submission to its end, or to now)."""

    tier: str
    ranks: int
    ideal: float
    real: float


def sla_jobs(s: Session, at: float) -> list[JobTimes]:
    """Jobs that have started and are live, or ended within :data:`SLA_WINDOW_S` of ``at``."""
    rows: Iterable[MetricJobRow] = s.scalars(select(MetricJobRow).where(
        MetricJobRow.started.is_(True),
        MetricJobRow.finished_at.is_(None) | (MetricJobRow.finished_at >= at - SLA_WINDOW_S)))
    out = []
    for j in rows:
        ideal = float(j.run_s or 0.0) + (max(0.0, at - j.running_since) if j.running_since is not None else 0.0)
        end = j.finished_at if j.finished_at is not None else at
        out.append(JobTimes(j.tier, j.ranks, ideal, max(0.0, end - j.submitted_at)))
    return out


def by_tier(items: Sequence[JobTimes]) -> dict[str, list[JobTimes]]:
    out: dict[str, list[JobTimes]] = {}
    for it in items:
        out.setdefault(it.tier, []).append(it)
    return out
