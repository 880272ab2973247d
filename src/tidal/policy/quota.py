"""Admission of guaranteed tiers against per-project quotas (like Kueue's nominal quotas).

A premium or standard job may take devices from lower tiers only while its project's guaranteed usage
(devices held by its premium and standard jobs) plus the job stays within ``share × capacity``; beyond
that it is served like basic work (it can still use idle devices). Projects without a quota are not
limited.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidal.policy.state import JobRec, SchedState


def guaranteed_usage(st: SchedState, project: str) -> int:
    return sum(len(r.devices) for r in st.running.values() if r.project == project and r.tier > 0)


def within_quota(st: SchedState, rec: JobRec, quotas: Mapping[str, float]) -> bool:
    share = quotas.get(rec.project)
    if share is None:
        return True
    return guaranteed_usage(st, rec.project) + rec.W <= share * st.capacity
