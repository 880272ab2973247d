"""Fencing left-overs of a dead agent on this node.

A rank dies with its agent (its init watches the lifeline), except while it is frozen for a dump: a task in
the v1 freezer cannot act on SIGKILL until it is thawed. So an agent that takes a node over first kills
whatever is left in the node's rank cgroups (cgroup2: ``cgroup.kill``, which frozen tasks obey too), thaws
them so the kill lands, and waits until they are empty. Nothing of an old incarnation runs again, and the
rank's cgroup is free for the job's next restore on this node."""

from __future__ import annotations

import logging

from tidal.mechanisms.criu import cgroups

log = logging.getLogger(__name__)


def reap_leftovers(node: str, timeout: float = 10.0) -> list[int]:
    """Kill every process left in ``node``'s rank cgroups; returns their pids."""
    hierarchy = cgroups.current()
    if hierarchy is None:  # no cgroups here: nothing can have been left in one
        return []
    killed: list[int] = []
    for group in hierarchy.rank_groups(node):
        killed += group.kill()
        group.wait_empty(timeout)
        group.remove()
    if killed:
        log.warning("fenced %d process(es) left on %s by a previous agent: %s", len(killed), node, killed)
    return killed
