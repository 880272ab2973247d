"""FIFO and SJF as in the Helios simulator (Hu et al., SC'21, ``QSSF Service/policies``).

Pending jobs are sorted (by submission for FIFO, by the oracle run time for SJF) and started in that
order until the first that does not fit: head-of-line blocking, no backfill, no preemption. Gangs are
placed consolidated (one node up to a node's size, else whole nodes), as Helios's ``consolidate`` placer.
With jobs pinned to virtual clusters each cluster has its own queue, as Helios simulates each VC alone.
"""

from __future__ import annotations

from collections.abc import Callable

from tidal.policy.base import BasePolicy
from tidal.policy.global_level import place
from tidal.policy.queue_order import Key, PendingQueue
from tidal.policy.state import JobRec


class OrderedBlocking(BasePolicy):
    name = "ordered"

    def __init__(self, key: Callable[[JobRec], Key]) -> None:
        super().__init__()
        self._key = key
        self.queues: dict[str | None, PendingQueue] = {}

    def on_rebuild(self, now: float) -> None:
        assert self.st is not None
        self.queues = {}
        for rec in self.st.pending.values():
            self.on_pending(rec, now)

    def on_pending(self, rec: JobRec, now: float) -> None:
        q = self.queues.get(rec.home)
        if q is None:
            q = self.queues[rec.home] = PendingQueue(self._key)
        q.add(rec)

    def on_gone(self, rec: JobRec, now: float) -> None:
        q = self.queues.get(rec.home)
        if q is not None:
            q.remove(rec.id)

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        scopes = list(self.queues) if freed else list(dict.fromkeys(r.home for r in new))
        for scope in scopes:
            q = self.queues[scope]
            while True:
                head = q.first()
                if head is None:
                    break
                devs = place(st, head, head.W)
                if devs is None:
                    break  # head-of-line blocking: nobody behind the head starts
                self.start(head, devs, now)


class Fifo(OrderedBlocking):
    name = "fifo"

    def __init__(self) -> None:
        super().__init__(lambda r: (r.submit,))


class Sjf(OrderedBlocking):
    """Oracle: knows each job's run time (``duration_hint``)."""

    name = "sjf"

    def __init__(self) -> None:
        super().__init__(lambda r: (r.duration if r.duration is not None else float("inf"), r.submit))
