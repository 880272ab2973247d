"""SRTF as in the Helios simulator: an oracle, preemptive shortest-remaining-time-first.

At every decision all jobs (running and pending) are sorted by remaining run time; devices are granted
greedily in that order by count; running jobs left out are preempted (checkpointed: the engine charges
the cost model's pause), pending jobs granted devices start if their gang can be placed (consolidated
placement may still fail, as in Helios). Per virtual cluster when jobs are pinned. Drained nodes' devices are
not granted, and the jobs running on them are left out of the order: they run on, holding devices no one
else could have.
"""

from __future__ import annotations

from tidal.policy.base import BasePolicy
from tidal.policy.global_level import place
from tidal.policy.state import JobRec


class Srtf(BasePolicy):
    name = "srtf"

    def schedule(self, now: float, new: list[JobRec], freed: bool) -> None:
        st = self.st
        assert st is not None
        scopes: dict[str | None, list[JobRec]] = {}
        drained = st.drained
        for rec in st.jobs.values():
            if drained and rec.running and any(d.node in drained for d in rec.devices):
                continue
            scopes.setdefault(rec.home, []).append(rec)
        for scope, recs in scopes.items():
            quota = st.capacity if scope is None else st.topology.cluster(scope).devices - sum(
                st.node_size[n] for n in drained if st.node_cluster[n] == scope)
            recs.sort(key=lambda r: (r.remaining_at(now), r.seq))
            chosen: list[JobRec] = []
            out: list[JobRec] = []
            for r in recs:
                if quota >= r.W:
                    quota -= r.W
                    if not r.running:
                        chosen.append(r)
                elif r.running:
                    out.append(r)
            for r in out:
                self.preempt(r, now, reason="longer remaining time")
            for r in chosen:
                devs = place(st, r, r.W)
                if devs is not None:
                    self.start(r, devs, now)
