"""Actions the policy asks for. Each has an id so that dispatching it is idempotent."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from tidal.core.topology import DeviceRef


class ActionKind(enum.Enum):
    PLACE = "place"  # start a pending job on ``placement``
    PREEMPT = "preempt"  # checkpoint and stop (``kill=True``: stop without a checkpoint, requeue)
    RESUME = "resume"  # restore a preempted job on ``placement``
    MIGRATE = "migrate"  # checkpoint, move, restore on ``placement``
    RESIZE = "resize"  # checkpoint, restore on a different number of devices (shrink/grow)
    TIME_SLICE = "time_slice"  # start/resume a job on devices that another job keeps (Gandiva)

    __hash__ = object.__hash__  # identity: see JobState


# What the live control plane can run; time-slicing different jobs on one device is simulator-only.
LIVE_EXECUTABLE = frozenset({ActionKind.PLACE, ActionKind.PREEMPT, ActionKind.RESUME, ActionKind.MIGRATE,
                             ActionKind.RESIZE})


@dataclasses.dataclass(frozen=True, slots=True)
class Action:
    id: str
    kind: ActionKind
    job_id: str
    placement: tuple[DeviceRef, ...] = ()  # rank → device, length W (empty for preempt)
    cause: str | None = None  # the event id that triggered the decision
    kill: bool = False  # preempt by killing (loses work since the user's last checkpoint)
    reason: str = ""

    @property
    def live_executable(self) -> bool:
        return self.kind in LIVE_EXECUTABLE and not self.kill

    @property
    def devices(self) -> tuple[DeviceRef, ...]:
        return tuple(dict.fromkeys(self.placement))

    def to_record(self) -> dict[str, Any]:
        return {
            "type": "action",
            "id": self.id,
            "kind": self.kind.value,
            "job": self.job_id,
            "placement": [[d.node, d.index] for d in self.placement],
            "cause": self.cause,
            "kill": self.kill,
            "live": self.live_executable,
            "reason": self.reason,
        }
