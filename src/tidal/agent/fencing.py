"""Fencing left-overs of a dead agent on this node.

A rank dies with its agent (its init watches the lifeline), except while it is frozen for a dump: a frozen
task cannot act on SIGKILL until it is thawed. So an agent that takes a node over first kills whatever is
left in the node's freezer cgroups, then thaws them so the kill lands. Nothing of an old incarnation runs
again, and the rank's cgroup is free for the job's next restore on this node."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

from tidal.mechanisms.criu.cgroups import ROOT

log = logging.getLogger(__name__)


def reap_leftovers(node: str, timeout: float = 10.0) -> list[int]:
    """Kill every process left in ``node``'s rank cgroups; returns their pids."""
    base = ROOT / "freezer" / "tidal" / node
    if not base.is_dir():
        return []
    killed: list[int] = []
    for cg in sorted(p for p in base.iterdir() if p.is_dir()):
        procs = cg / "cgroup.procs"
        try:
            pids = [int(x) for x in procs.read_text().split()]
        except FileNotFoundError:
            continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            (cg / "freezer.state").write_text("THAWED")
        killed += pids
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if not procs.read_text().split():
                    break
            time.sleep(0.02)
        with contextlib.suppress(OSError):
            cg.rmdir()
    if killed:
        log.warning("fenced %d process(es) left on %s by a previous agent: %s", len(killed), node, killed)
    return killed
