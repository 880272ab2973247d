"""The agent's own view of its node's lease, so that it can fence itself before the control plane requeues
the node's jobs.

The control plane sets a node's lease to run out ``lease_s`` after it *received* the agent's latest
heartbeat (or registration). The agent cannot know when that was, but it knows an earlier moment: when it
*sent* that request. So for each request the control plane acknowledged, the agent's deadline is its send
time plus ``lease_s``, which comes no later than the control plane's; a reply that came late changes
nothing, and a request that was never acknowledged counts for nothing (the control plane may not have
renewed anything). The agent fences (kills its ranks) :func:`fence_margin` seconds before that deadline:
by the time the control plane requeues the node's jobs, they no longer run here.

:class:`LeaseClock` holds that logic, with no threads nor I/O of its own, and a monotonic clock that tests
can move by hand. A lease belongs to one agent id (the agent takes a new one each time it registers again),
and each transition that ends it (:meth:`LeaseClock.expire`, :meth:`LeaseClock.lose`) succeeds once: of
the agent's threads that find it gone at the same time, one alone fences and registers again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidal.errors import ValidationError

#: The least time between the agent's fence and the control plane's requeue, in seconds.
MIN_MARGIN_S = 0.5


def fence_margin(lease_s: float) -> float:
    """How long before its own lease deadline the agent fences: ``max(0.5 s, lease_s / 4)``.

    The margin must cover what lies between the deadline and the last rank being unable to run: the
    watchdog waking late (it looks every :data:`WATCH_INTERVAL_S`; a loaded host schedules it later),
    SIGKILL sent to every rank of every job, and a rank frozen for a dump thawed so that the kill lands
    (a cgroup write). Those take milliseconds to a few tenths of a second; half a second is the floor, a
    quarter of the lease is kept for longer leases, whose hosts may be busier, at the cost of fencing that
    much earlier in an outage. It leaves three quarters of the lease for renewals to be acknowledged."""
    return max(MIN_MARGIN_S, lease_s / 4)


def request_timeout(lease_s: float) -> float:
    """The HTTP timeout of a heartbeat or a registration: a quarter of the lease, so that a request to a
    control plane that does not answer gives up, and another is tried, well before the agent must fence
    (with heartbeats every fifth of the lease, two tries fit before the deadline even when the first one
    hangs)."""
    return lease_s / 4


#: How often, at most, the watchdog looks at the deadline (a reply may shorten the lease).
WATCH_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Attempt:
    """A heartbeat or registration about to be sent: the monotonic time it was sent at."""

    sent: float


class LeaseClock:
    """Whether this agent holds its node's lease, and until when it may assume so (see the module).

    ``monotonic``: where the time is read (``time.monotonic``; a fake clock's in tests). Thread-safe."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._now = monotonic
        self._lock = threading.Lock()
        self._holder: str | None = None  # the agent id holding the lease, None while none does
        self._sent = 0.0  # send time of the latest acknowledged renewal
        self._lease_s = 0.0

    def attempt(self) -> Attempt:
        """Take the time, just before a heartbeat or registration is sent."""
        return Attempt(self._now())

    def held(self, agent_id: str, attempt: Attempt, lease_s: float) -> None:
        """The control plane acknowledged ``agent_id``'s registration sent at ``attempt``: it holds the
        lease, for ``lease_s`` seconds from then."""
        if lease_s <= 0:
            raise ValidationError(f"lease_s: a lease lasts more than 0 seconds, not {lease_s}", field="lease_s")
        with self._lock:
            self._holder, self._sent, self._lease_s = agent_id, attempt.sent, lease_s

    def renewed(self, agent_id: str, attempt: Attempt, lease_s: float) -> bool:
        """The control plane acknowledged a heartbeat ``agent_id`` sent at ``attempt``: the lease runs
        ``lease_s`` from then. False, and nothing changes, when ``agent_id`` no longer holds the lease (the
        agent fenced meanwhile: that lease is over for it, whatever the control plane thinks) or a
        heartbeat sent later was acknowledged already."""
        if lease_s <= 0:
            raise ValidationError(f"lease_s: a lease lasts more than 0 seconds, not {lease_s}", field="lease_s")
        with self._lock:
            if agent_id != self._holder or attempt.sent < self._sent:
                return False
            self._sent, self._lease_s = attempt.sent, lease_s
            return True

    @property
    def holder(self) -> str | None:
        with self._lock:
            return self._holder

    @property
    def lease_s(self) -> float:
        """How long the lease lasts, as the control plane last said (0 before the first registration)."""
        with self._lock:
            return self._lease_s

    @property
    def last_acknowledged(self) -> float:
        """The monotonic send time of the latest acknowledged heartbeat or registration."""
        with self._lock:
            return self._sent

    def since_acknowledged(self) -> float:
        """Seconds since the latest acknowledged heartbeat or registration was sent."""
        return self._now() - self.last_acknowledged

    def deadline(self) -> float | None:
        """The monotonic time at which the agent fences, or None while it holds no lease."""
        with self._lock:
            return self._deadline()

    def _deadline(self) -> float | None:
        if self._holder is None:
            return None
        return self._sent + self._lease_s - fence_margin(self._lease_s)

    def remaining(self) -> float | None:
        """Seconds until the agent must fence (0 or less: now), or None while it holds no lease."""
        deadline = self.deadline()
        return None if deadline is None else deadline - self._now()

    def expire(self) -> str | None:
        """If the deadline has come, the lease is over: return the agent id that held it (the caller fences
        its ranks, once: a second call returns None). Else None."""
        with self._lock:
            deadline = self._deadline()
            if deadline is None or self._now() < deadline:
                return None
            holder, self._holder = self._holder, None
            return holder

    def lose(self, agent_id: str) -> bool:
        """The control plane said ``agent_id``'s lease is lost: True if it held the lease until now (the
        caller fences, once); False if it did not (an answer to a request made under an older lease, or
        another thread got there first)."""
        with self._lock:
            if agent_id != self._holder:
                return False
            self._holder = None
            return True
