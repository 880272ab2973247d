"""Gandiva-style time-slicing when oversubscribed: a waiting job shares the devices of a running job
of the same size (at most two jobs a device, each at half speed times the switching efficiency), and
is moved to devices of its own as soon as some are free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal.core import ActionKind
from tidal.policy.global_level import place
from tidal.policy.state import JobRec

if TYPE_CHECKING:
    from tidal.policy.singularity import Singularity


def find_host(pol: Singularity, rec: JobRec, now: float) -> JobRec | None:
    st = pol.st
    assert st is not None
    hosts = pol.sharable.get(rec.W)
    if not hosts:
        return None
    for hid in hosts:
        h = st.jobs[hid]
        if h.tier > rec.tier or h.shared or len(h.devices) != rec.W:
            continue
        if st.drained and any(d.node in st.drained for d in h.devices):
            continue  # a drained node takes no new job, a guest neither
        if rec.home is not None and st.node_cluster[h.devices[0].node] != rec.home:
            continue
        return h  # sharing only slows the host down: no minimum run time needed
    return None


def unshare(pol: Singularity, now: float) -> None:
    """Give time-sliced jobs devices of their own when some are free."""
    st = pol.st
    assert st is not None
    if st.free_total == 0 or not pol.guests:
        return
    failed = 1 << 30  # smallest size that did not fit: larger guests cannot fit either
    for jid in list(pol.guests):
        if st.free_total == 0 or failed <= 1:
            break
        rec = st.jobs[jid]
        if failed <= rec.W or (rec.home is not None and st.cluster_free.get(rec.home, 0) < rec.W):
            continue
        devs = place(st, rec, rec.W)
        if devs is not None:
            pol.move(rec, devs, now, kind=ActionKind.MIGRATE, reason="end time-slice")
        elif rec.home is None:
            failed = rec.W
