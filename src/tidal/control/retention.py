"""Checkpoint retention: which checkpoints go, and the collector that deletes them.

The rules, in this order (docs/store.md):

1. a job keeps its newest ``keep`` good checkpoints (``TIDAL_KEEP_CHECKPOINTS``; the one it is set to resume
   from stays whatever its age; bad ones are kept for inspection);
2. a finished job's checkpoints go ``finished_after`` seconds after it ended (``TIDAL_FINISHED_RETENTION``);
3. a user over their store quota (``TIDAL_STORE_QUOTA``, on the checkpoints' sizes) loses the oldest
   checkpoints of their finished jobs first, then the older checkpoints of their other jobs, oldest first; never
   the newest good checkpoint of a job that has not finished, nor the one a job resumes from. When that is not
   enough, the user stays over quota: an event ``store_quota`` says so (once, until they are under again).

The :class:`Collector` runs beside the reconcile loop: every ``interval`` seconds, in one transaction, it marks
the doomed checkpoints as no longer retained (the API, restores and ``tidal resume --from`` no longer see
them) and records why; then, outside the transaction, it deletes them from the store and collects the chunks
nothing names any more, safely while agents write checkpoints (``tidal.mechanisms.storage.sweep``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.history import record
from tidal.control.jobs import good, parts_of, retired
from tidal.control.store.db import Database
from tidal.control.store.models import CheckpointRow, JobRow
from tidal.core import JobState
from tidal.core.lifecycle import TERMINAL
from tidal.core.units import size
from tidal.errors import TidalError, ValidationError
from tidal.mechanisms.storage import CheckpointStore

log = logging.getLogger(__name__)

DEFAULT = "*"
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``1073741824``, ``1GiB``, ``500G``, ``1.5Ti`` → bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ValidationError(f"bad size {text!r}", field="store_quota",
                              hint="give bytes, or a number with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def parse_store_quotas(text: str | None) -> dict[str, int]:
    """``user=SIZE,...``; ``*=SIZE`` for every user not named. Empty: no quota."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        user, sep, size = item.partition("=")
        if not sep or not user.strip():
            raise ValidationError(f"bad store quota {item.strip()!r}: expected user=SIZE", field="store_quota",
                                  hint="e.g. TIDAL_STORE_QUOTA='alice=2TiB,*=500GiB'")
        out[user.strip()] = parse_size(size)
    return out


@dataclass(frozen=True)
class Rules:
    keep: int = 3
    finished_after: float = 7 * 86400.0
    quotas: Mapping[str, int] = field(default_factory=dict)

    def quota(self, user: str) -> int | None:
        return self.quotas.get(user, self.quotas.get(DEFAULT))


@dataclass(frozen=True)
class Doomed:
    row: CheckpointRow
    why: str  # "keep", "finished" or "quota"


@dataclass
class Plan:
    doomed: list[Doomed]
    over: dict[str, tuple[int, int]]  # users still over quota: (bytes kept, quota)
    whole: set[str]  # finished jobs that keep no checkpoint: their whole store directory goes


def _finished(job: JobRow) -> bool:
    return JobState(job.state) in TERMINAL


def plan(s: Session, rules: Rules, at: float) -> Plan:
    """What goes now, by the rules above (pure over the database's rows)."""
    rows: dict[str, list[CheckpointRow]] = defaultdict(list)
    for r in s.scalars(select(CheckpointRow).where(CheckpointRow.retained.is_(True))
                       .order_by(CheckpointRow.created_at, CheckpointRow.id)):
        rows[r.job_id].append(r)
    jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(list(rows))))} if rows else {}
    doomed: list[Doomed] = []
    kept: dict[str, list[CheckpointRow]] = {}
    whole: set[str] = set()
    for job_id, mine in rows.items():
        job = jobs.get(job_id)
        if job is None:
            continue
        if _finished(job) and (job.finished_at or 0.0) + rules.finished_after <= at:
            doomed += [Doomed(r, "finished") for r in mine]
            whole.add(job_id)
            continue
        gone = {r.id for r in retired(mine, rules.keep, job.resume_from)}
        doomed += [Doomed(r, "keep") for r in mine if r.id in gone]
        kept[job_id] = [r for r in mine if r.id not in gone]
    over: dict[str, tuple[int, int]] = {}
    by_user: dict[str, list[str]] = defaultdict(list)
    for job_id in kept:
        by_user[jobs[job_id].owner].append(job_id)
    for user, job_ids in sorted(by_user.items()):
        quota = rules.quota(user)
        if quota is None:
            continue
        total = sum(r.bytes for j in job_ids for r in kept[j])
        for r in _quota_order([jobs[j] for j in job_ids], kept):
            if total <= quota:
                break
            doomed.append(Doomed(r, "quota"))
            total -= r.bytes
            kept[r.job_id].remove(r)
        if total > quota:
            over[user] = (total, quota)
    for job_id in list(kept):
        if not kept[job_id] and _finished(jobs[job_id]):
            whole.add(job_id)
    return Plan(doomed, over, whole)


def _quota_order(user_jobs: Sequence[JobRow], kept: Mapping[str, list[CheckpointRow]]) -> list[CheckpointRow]:
    """What a user over quota loses, first to last: their finished jobs' checkpoints, oldest first; then their
    other jobs' checkpoints but each one's newest good one and the one it resumes from, oldest first."""
    finished = [r for j in user_jobs if _finished(j) for r in kept[j.id]]
    others = []
    for j in user_jobs:
        if _finished(j):
            continue
        ok = good(kept[j.id])
        spare = {ok[-1].id} if ok else set()
        spare |= {j.resume_from} if j.resume_from else set()
        others += [r for r in kept[j.id] if r.id not in spare]
    return sorted(finished, key=lambda r: (r.created_at, r.id)) + sorted(others, key=lambda r: (r.created_at, r.id))


def usage(s: Session, owner: str | None) -> dict[str, Any]:
    """Bytes of the checkpoints kept, per user and per job (``owner``: that user's only)."""
    q = (select(CheckpointRow, JobRow).join(JobRow, JobRow.id == CheckpointRow.job_id)
         .where(CheckpointRow.retained.is_(True)).order_by(JobRow.owner, JobRow.seq))
    if owner is not None:
        q = q.where(JobRow.owner == owner)
    jobs: dict[str, dict[str, Any]] = {}
    for ck, job in s.execute(q):
        j = jobs.setdefault(job.id, {"job": job.id, "name": job.name, "owner": job.owner, "state": job.state,
                                     "checkpoints": 0, "bytes": 0, "stored_bytes": 0})
        j["checkpoints"] += 1
        j["bytes"] += ck.bytes
        j["stored_bytes"] += ck.stored_bytes
    users: dict[str, dict[str, Any]] = {}
    for j in jobs.values():
        u = users.setdefault(j["owner"], {"user": j["owner"], "jobs": 0, "checkpoints": 0, "bytes": 0,
                                          "stored_bytes": 0})
        u["jobs"] += 1
        for k in ("checkpoints", "bytes", "stored_bytes"):
            u[k] += j[k]
    return {"users": list(users.values()), "jobs": list(jobs.values())}


class Collector:
    """Applies :class:`Rules` to the database and its stores (one, or one per region: a checkpoint may have
    been replicated to several) every ``interval`` seconds, in its own thread."""

    def __init__(self, db: Database, stores: CheckpointStore | Sequence[CheckpointStore], rules: Rules, *,
                 interval: float = 300.0) -> None:
        self.db = db
        self.stores = [stores] if isinstance(stores, CheckpointStore) else list(stores)
        self.rules = rules
        self.interval = interval
        self._over: set[str] = set()  # users told they are over quota, until they are under again
        # Store deletions that failed, per store: tried again at the next pass.
        self._undone: dict[int, list[tuple[str, list[str], bool]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tidal-collect", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.once()
            except Exception:
                log.exception("checkpoint collection failed; the next pass tries again")

    def once(self) -> list[str]:
        """One pass; returns the ids of the checkpoints it deleted."""
        with self.db.tx() as s:
            p = plan(s, self.rules, now(s))
            for d in p.doomed:
                d.row.retained = False
            per_job: dict[str, list[Doomed]] = defaultdict(list)
            for d in p.doomed:
                per_job[d.row.job_id].append(d)
            for job_id, ds in per_job.items():
                why = sorted({d.why for d in ds})
                record(s, "checkpoints_deleted", job_id=job_id, cause="retention",
                       detail=f"{len(ds)} checkpoint(s) deleted ({', '.join(_WHY[w] for w in why)}): "
                              + ", ".join(d.row.id for d in ds))
            for user, (total, quota) in sorted(p.over.items()):
                if user not in self._over:
                    record(s, "store_quota", cause="retention",
                           detail=f"user {user} keeps {size(total)} of checkpoints, over their store quota of "
                                  f"{size(quota)}, with only each unfinished job's newest checkpoint left")
                    log.warning("user %s is over their store quota (%d of %d bytes) with only the newest "
                                "checkpoints of unfinished jobs left", user, total, quota)
            self._over = set(p.over)
            work = [(job_id, [part for d in ds for part in parts_of(d.row)], job_id in p.whole)
                    for job_id, ds in per_job.items()]
        for i, store in enumerate(self.stores):
            self._delete(i, store, self._undone.pop(i, []) + work)
        return [d.row.id for d in p.doomed]

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def _delete(self, i: int, store: CheckpointStore, work: list[tuple[str, list[str], bool]]) -> None:
        deleted = False
        for job_id, parts, whole in work:
            try:
                if whole:
                    store.delete_job(job_id, collect=False)
                else:
                    for part in parts:
                        store.delete(job_id, part)
                deleted = True
            except TidalError as e:
                log.warning("deleting checkpoints of job %s from %s failed (tried again): %s", job_id, store.url, e)
                self._undone.setdefault(i, []).append((job_id, parts, whole))
        if deleted:
            try:
                store.gc()
            except TidalError as e:
                log.warning("garbage collection of the checkpoint store %s failed: %s", store.url, e)


_WHY = {"keep": "beyond the newest kept per job", "finished": "the job finished", "quota": "over the store quota"}
