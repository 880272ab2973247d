"""Reservations: a guaranteed gang that cannot start drains nodes for itself.

Without them, a large premium/standard gang can wait for ever: every device freed on a node is taken at
once by smaller jobs of its tier (backfill) or of lower tiers, so the node never holds only work it may
preempt. The first waiting gang of each guaranteed tier reserves the nodes it needs — those holding the
most free devices and lower-tier work — and only jobs of a higher tier may start there until it does.
During a decision reserved nodes are hidden from placement (``SchedState.node_down``) and shown only to
the jobs allowed on them.

Backfill (``lend``): while the gang is not due, its nodes' idle devices are lent to work it may preempt
(a lower tier), which it reclaims by checkpoint when it can start: it preempts lower-tier work on its
nodes as soon as what it may not preempt (its tier and above) has left them. Lending stops once the gang
is due within ``min_lend_s`` (its horizon: when the running jobs' remaining times free its devices), when
a borrower would barely start before being checkpointed again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tidal.policy.state import JobRec, SchedState

if TYPE_CHECKING:
    from tidal.policy.singularity import Singularity


def may_borrow(borrower_tier: int, gang_tier: int, horizon_s: float, min_lend_s: float) -> bool:
    """Whether a job of ``borrower_tier`` may start on devices reserved for a gang of ``gang_tier`` that is
    due in ``horizon_s``: only work the gang may preempt, and only while the gang is not about to be due."""
    return borrower_tier < gang_tier and horizon_s > min_lend_s


class Reservations:
    def __init__(self) -> None:
        self.by_job: dict[str, tuple[int, list[str]]] = {}  # job → (its tier, nodes)
        self.by_tier: dict[int, str] = {}

    def hide(self, st: SchedState) -> None:
        for _, nodes in self.by_job.values():
            for n in nodes:
                st.node_down(n)

    def show(self, st: SchedState) -> None:
        for _, nodes in self.by_job.values():
            for n in nodes:
                st.node_up(n)

    def allowed(self, rec: JobRec, horizon: Callable[[str], float] | None = None,
                min_lend_s: float = 0.0) -> list[str]:
        """Reserved nodes ``rec`` may use: its own, those held for a lower tier and, with ``horizon`` (the
        seconds until a gang is due), those lent to it by backfill."""
        out: list[str] = []
        if not self.by_job:
            return out
        for jid, (tier, nodes) in self.by_job.items():
            if jid == rec.id or tier < rec.tier or (
                    horizon is not None and may_borrow(rec.tier, tier, horizon(jid), min_lend_s)):
                out.extend(nodes)
        return out

    def drop(self, job_id: str, st: SchedState, hidden: bool) -> None:
        item = self.by_job.pop(job_id, None)
        if item is None:
            return
        tier, nodes = item
        if self.by_tier.get(tier) == job_id:
            del self.by_tier[tier]
        if hidden:
            for n in nodes:
                st.node_up(n)

    def make(self, pol: Singularity, rec: JobRec, clusters: list[str]) -> None:
        """Reserve nodes for ``rec`` if it is the first waiting gang of its guaranteed tier."""
        st = pol.st
        assert st is not None
        if rec.tier == 0 or rec.W < 2 or rec.tier in self.by_tier or rec.id in self.by_job:
            return
        for c in clusters:
            m = st.cluster_m[c]
            k = -(-rec.hi // m)
            room = st.room[rec.tier][c]
            nodes: list[str] = []
            for v in range(m, 0, -1):  # nodes with the most free + lower-tier devices first
                for node in room[v]:
                    if node not in st.down and st.node_size[node] >= min(rec.hi, m):
                        nodes.append(node)
                        if len(nodes) >= k:
                            break
                if len(nodes) >= k:
                    break
            if len(nodes) >= k:
                self.by_job[rec.id] = (rec.tier, nodes)
                self.by_tier[rec.tier] = rec.id
                for n in nodes:
                    st.node_down(n)  # hidden from now on in this decision
                return
