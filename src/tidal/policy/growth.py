"""Growth into idle devices: jobs running on fewer devices than they could use grow back.

Highest tier first, then the most shrunk. A single-node job grows in place when its node has room,
else moves to a node where it fits larger (a resize is a checkpoint and a restore either way). A job
is not resized again within the minimum run time, so shrink/grow cannot ping-pong. A job grows no further
than its owner's and its project's device caps allow (policy/device_cap.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal.core import ActionKind, DeviceRef
from tidal.policy.global_level import place
from tidal.policy.placement import useful_sizes

if TYPE_CHECKING:
    from tidal.policy.singularity import Singularity


def grow(pol: Singularity, now: float) -> None:
    st = pol.st
    assert st is not None
    if st.free_total == 0 or not pol.shrunk:
        return
    cands = [st.jobs[j] for j in pol.shrunk]
    cands.sort(key=lambda r: (-r.tier, len(r.devices) / r.W, r.seq))
    for rec in cands:
        if st.free_total == 0:
            break
        if rec.shared or now - rec.last_change < pol.cfg.min_run_s:
            continue
        d = len(rec.devices)
        left = pol.device_room(rec)
        hi = rec.hi if left is None else min(rec.hi, d + left)
        for size in useful_sizes(rec.W, d + 1, hi):
            nodes = {x.node for x in rec.devices}
            devs: list[DeviceRef] | None = None
            if len(nodes) == 1:
                node = next(iter(nodes))
                # Not on a drained node: it takes nothing new, more ranks of a job already there neither.
                if (node not in st.drained and size <= st.cluster_m[st.node_cluster[node]]
                        and len(st.free_idx[node]) >= size - d):
                    devs = list(rec.devices) + [DeviceRef(node, i) for i in st.free_idx[node][: size - d]]
            if devs is None:
                devs = place(st, rec, size)
            if devs is not None:
                pol.move(rec, devs, now, kind=ActionKind.RESIZE, reason=f"grow {d}->{size}")
                break
