"""The phases of a job's operation in flight, as an explicit transition table; an invalid step raises.

A job has at most one operation at a time: starting its ranks (a launch or a restore), or checkpointing
them for a purpose (periodic, hold, preempt, migrate, resize). Each phase has the orders of one kind out
on the job's nodes; the phase advances once every node has answered, except that a park answer whose needs
raise the targets starts the next park round at once (the other nodes' ranks may be waiting for the ranks
that need more, so their answers would never come; docs/architecture.md draws it)::

    idle ─→ starting ─────────────────────────────────→ idle        launch / restore
    idle ─→ precopy ──────────────────────────────────→ idle        a move to another region's store
    idle ─→ checkpoint ───────────────────────────────→ idle        a checkpoint on one node
    idle ─→ cut ─→ park ─→ dump ─→ finish ────────────→ idle        a checkpoint over several nodes
                    ↺ park                                        a rank needs more: raised targets
              └──────┴───────┴──→ finish (resume: a step failed)
    any live phase ─→ failing ─→ idle                               a rank failed: settle once all ended
    any phase ─→ idle                                               the job was lost, requeued or ended

A checkpoint that stops the job and restores it elsewhere (migrate, resize) goes idle and then starting
in the same transaction. A move into a region whose store lacks the job's last checkpoint first copies
it there while the job runs on (precopy, prestage orders awaited), then goes idle and checkpoints in the
same transaction. Its targets may be sent prestage orders as it starts (and unstage orders when it
ends): side orders, like kill, which no phase awaits and which never move the operation.
"""

from __future__ import annotations

import enum

from tidal.errors import Conflict


class Phase(enum.Enum):
    IDLE = "idle"
    STARTING = "starting"  # launch or restore orders out
    PRECOPY = "precopy"  # the move's targets copy the last checkpoint into their region's store; the job runs
    CHECKPOINT = "checkpoint"  # the checkpoint order of a job on one node out
    CUT = "cut"  # over several nodes: every rank says how many collectives it announced
    PARK = "park"  # every rank runs to the targets and waits; a round that raised them starts another
    DUMP = "dump"  # every node dumps and stores its part
    FINISH = "finish"  # kill the frozen ranks, or let them go on
    FAILING = "failing"  # a rank failed: the others are stopped, the failure settled once all have ended

    __hash__ = object.__hash__


class Purpose(enum.Enum):
    """Why the operation runs."""

    LAUNCH = "launch"
    RESTORE = "restore"
    PERIODIC = "periodic"  # the job goes on after the checkpoint
    HOLD = "hold"  # stopped until the user resumes it
    PREEMPT = "preempt"  # stopped, requeued
    MIGRATE = "migrate"  # stopped, restored on the target devices
    RESIZE = "resize"  # the same, on another number of devices

    __hash__ = object.__hash__

    @property
    def stops(self) -> bool:
        """The job's ranks are killed once its checkpoint is committed."""
        return self in (Purpose.HOLD, Purpose.PREEMPT, Purpose.MIGRATE, Purpose.RESIZE)


P = Phase

STEPS: dict[Phase, frozenset[Phase]] = {
    P.IDLE: frozenset({P.STARTING, P.PRECOPY, P.CHECKPOINT, P.CUT, P.FAILING, P.IDLE}),
    P.STARTING: frozenset({P.IDLE, P.FAILING}),
    P.PRECOPY: frozenset({P.IDLE, P.FAILING}),
    P.CHECKPOINT: frozenset({P.IDLE, P.FAILING}),
    P.CUT: frozenset({P.PARK, P.FINISH, P.FAILING, P.IDLE}),
    P.PARK: frozenset({P.PARK, P.DUMP, P.FINISH, P.FAILING, P.IDLE}),
    P.DUMP: frozenset({P.FINISH, P.FAILING, P.IDLE}),
    P.FINISH: frozenset({P.IDLE, P.FAILING}),
    P.FAILING: frozenset({P.IDLE}),
}

#: The order kind whose results a phase waits for (the failing phase waits for kill reports, not results).
AWAITS: dict[Phase, frozenset[str]] = {
    P.IDLE: frozenset(),
    P.STARTING: frozenset({"launch", "restore"}),
    P.PRECOPY: frozenset({"prestage"}),
    P.CHECKPOINT: frozenset({"checkpoint"}),
    P.CUT: frozenset({"cut"}),
    P.PARK: frozenset({"park"}),
    P.DUMP: frozenset({"checkpoint"}),
    P.FINISH: frozenset({"finish"}),
    P.FAILING: frozenset(),
}


def can_step(current: Phase, new: Phase) -> bool:
    return new in STEPS[current]


def step(current: Phase, new: Phase, *, job: str = "") -> Phase:
    """Return ``new`` if ``current → new`` is in the table, else raise :class:`Conflict`."""
    if new not in STEPS[current]:
        allowed = ", ".join(sorted(p.value for p in STEPS[current]))
        raise Conflict(f"job {job or '?'}: its operation cannot go from phase {current.value} to {new.value}",
                       hint=f"allowed from {current.value}: {allowed}", job=job, phase=current.value,
                       target=new.value)
    return new
