"""The job lifecycle as an explicit transition table (DESIGN.md §5); an invalid transition raises.

pending → running ⇄ checkpointing → (preempted | migrating | resizing) → restoring → running
→ succeeded | failed | cancelled.  Added for the live system:
- ``held``: a user hold, from pending or preempted (a running job is first checkpointed), released to
  pending;
- running → pending: kill-and-requeue (what Slurm/Kueue preemption does; used by the baseline and after
  a node failure without a usable checkpoint);
- checkpointing → running: a periodic checkpoint (fault tolerance) that the job continues after;
- any live state → failed/cancelled.
"""

from __future__ import annotations

import enum

from tidal.errors import Conflict


class JobState(enum.Enum):
    PENDING = "pending"
    HELD = "held"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    PREEMPTED = "preempted"
    MIGRATING = "migrating"
    RESIZING = "resizing"
    RESTORING = "restoring"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    # Members are singletons: hash by identity (C) rather than by name (Enum's default, Python code run on
    # every dict or set lookup, which the simulator does millions of times).
    __hash__ = object.__hash__


S = JobState
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
_END = {S.FAILED, S.CANCELLED}

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.PENDING: frozenset({S.RUNNING, S.HELD} | _END),
    S.HELD: frozenset({S.PENDING} | _END),
    S.RUNNING: frozenset({S.CHECKPOINTING, S.SUCCEEDED, S.PENDING} | _END),
    S.CHECKPOINTING: frozenset({S.RUNNING, S.PREEMPTED, S.MIGRATING, S.RESIZING} | _END),
    S.PREEMPTED: frozenset({S.RESTORING, S.HELD} | _END),
    S.MIGRATING: frozenset({S.RESTORING} | _END),
    S.RESIZING: frozenset({S.RESTORING} | _END),
    S.RESTORING: frozenset({S.RUNNING} | _END),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


def can_advance(current: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[current]


def advance(current: JobState, new: JobState, *, job: str = "") -> JobState:
    """Return ``new`` if ``current → new`` is in the table, else raise :class:`Conflict`."""
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none (terminal)"
        raise Conflict(
            f"job {job or '?'}: cannot go from {current.value} to {new.value}",
            hint=f"allowed from {current.value}: {allowed}",
            job=job,
            state=current.value,
            target=new.value,
        )
    return new
