"""Events: what happened, with a cause id. One log format for the simulator and the live system."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class EventKind(enum.Enum):
    JOB_SUBMITTED = "job_submitted"
    JOB_FINISHED = "job_finished"  # succeeded
    JOB_FAILED = "job_failed"
    JOB_CANCELLED = "job_cancelled"
    JOB_HELD = "job_held"
    JOB_RELEASED = "job_released"
    NODE_UP = "node_up"
    NODE_DOWN = "node_down"
    ACTION_DONE = "action_done"
    ACTION_FAILED = "action_failed"  # the policy resyncs from the view
    TICK = "tick"  # a wake-up the policy asked for (e.g. a Tiresias queue demotion)

    __hash__ = object.__hash__  # identity: see JobState


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    id: str
    time: float
    kind: EventKind
    job_id: str | None = None
    node: str | None = None
    cause: str | None = None  # id of the action or event that led to this one
    detail: str = ""

    def to_record(self) -> dict[str, Any]:
        """One line of the event log (JSON-ready)."""
        return {
            "type": "event",
            "id": self.id,
            "time": self.time,
            "kind": self.kind.value,
            "job": self.job_id,
            "node": self.node,
            "cause": self.cause,
            "detail": self.detail,
        }
