"""Drained nodes: nodes that take nothing new, while the jobs on them run on.

A job requeued because its node was lost spends none of its restarts (:mod:`tidal.control.failures`), so a node
that keeps losing its lease would have jobs restored onto it, and lost, without end. Such a node is drained
automatically: its lease lost :attr:`DrainRule.losses` times within :attr:`DrainRule.window_s`
(``TIDAL_DRAIN_LEASE_LOSSES`` times in ``TIDAL_DRAIN_WINDOW`` seconds) drains it, and once it has been healthy
(up, its lease renewed) for :attr:`DrainRule.healthy_s` (``TIDAL_DRAIN_HEALTHY_FOR``) it is undrained. An admin
drains a node by hand (``tidal node drain``; kept until ``tidal node undrain``), as ``kubectl cordon`` does.

Only the times of its last ``losses`` lease losses are kept per node: bounded whatever its history. An
automatic drain is withheld while it would leave more than half of the nodes drained: many nodes losing their
leases together points at the control plane or the network (a starved control plane cannot renew leases)
rather than at the nodes, and draining them all would stop every new start (Kubernetes's node controller
likewise stops evicting from a zone where most nodes are unhealthy).

The scheduler's policy reads the drained nodes from its view (:attr:`tidal.core.ClusterView.drained`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tidal.control.history import record
from tidal.control.store.models import NodeRow
from tidal.errors import NotFound

#: ``NodeRow.drain``: drained automatically (its lease kept being lost), or by an admin.
LEASE, ADMIN = "lease", "admin"
#: An automatic drain leaves at most this share of the nodes drained.
MAX_DRAINED_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class DrainRule:
    """When a node is drained for losing its lease, and when it is undrained. ``losses`` 0: never drained
    automatically. The defaults are the settings' (:class:`tidal.config.Settings`)."""

    losses: int = 3
    window_s: float = 600.0
    healthy_s: float = 600.0


def rule_of(s: Session) -> DrainRule:
    """The rule of this control plane (the server puts its settings' in ``Database.info["drains"]``)."""
    rule = s.info.get("drains")
    return rule if isinstance(rule, DrainRule) else DrainRule()


def span(seconds: float) -> str:
    """``10 min``, ``1 h``, ``45 s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def lease_lost(s: Session, node: NodeRow, now: float, cause: str) -> None:
    """``node``'s lease was lost at ``now`` (event ``cause``): note it, and drain the node when it has lost it
    too often."""
    rule = rule_of(s)
    if rule.losses < 1:
        return
    recent = [float(t) for t in (node.lease_losses or []) if float(t) > now - rule.window_s]
    node.lease_losses = [*recent, now][-rule.losses:]
    if len(node.lease_losses) < rule.losses or node.drain is not None:
        return  # (a drained node that loses it again: its healthy time starts again, see healthy_since)
    reason = f"lease lost {rule.losses} times in {span(rule.window_s)}"
    total = s.scalar(select(func.count()).select_from(NodeRow)) or 0
    drained = s.scalar(select(func.count()).select_from(NodeRow).where(NodeRow.drain.is_not(None))) or 0
    if drained + 1 > total * MAX_DRAINED_SHARE:
        record(s, "drain_withheld", node=node.name, cause=cause,
               detail=f"{reason}, but draining it would leave {drained + 1} of {total} node(s) drained, more than "
                      "half: leases lost on so many nodes point at the control plane or the network rather than at "
                      "the nodes; not drained")
        return
    _drain(s, node, LEASE, reason, None, now, cause)


def drain(s: Session, name: str, reason: str | None, admin: str, now: float, cause: str) -> dict[str, Any]:
    """An admin drains node ``name`` (``reason``: theirs, optional) until an admin undrains it; one drained
    automatically is from now on the admin's. What it is now (:func:`listing`'s fields)."""
    node = _node(s, name)
    text = " ".join((reason or "").split()) or None  # one line, as a table cell
    if node.drain != ADMIN or node.drain_reason != text or node.drained_by != admin:
        _drain(s, node, ADMIN, text, admin, now, cause)
    return {"name": node.name, **listing(s, node)}


def undrain(s: Session, name: str, admin: str, now: float, cause: str) -> dict[str, Any]:
    """An admin undrains node ``name`` (whoever drained it); its lease losses so far are forgotten."""
    node = _node(s, name)
    if node.drain is not None:
        was = describe(s, node)
        _undrain(s, node, cause, f"undrained by {admin} (it was {was})")
    return {"name": node.name, **listing(s, node)}


def _node(s: Session, name: str) -> NodeRow:
    node = s.get(NodeRow, name)
    if node is None:
        raise NotFound(f"no node {name}", node=name, hint="`tidal nodes` lists them")
    return node


def _drain(s: Session, node: NodeRow, kind: str, reason: str | None, by: str | None, now: float,
           cause: str) -> None:
    node.drain, node.drain_reason, node.drained_by, node.drained_at = kind, reason, by, now
    record(s, "node_drained", node=node.name, cause=cause, detail=describe(s, node) or "")


def _undrain(s: Session, node: NodeRow, cause: str, detail: str) -> None:
    node.drain = node.drain_reason = node.drained_by = node.drained_at = None
    node.lease_losses = []
    record(s, "node_undrained", node=node.name, cause=cause, detail=detail)


def describe(s: Session, node: NodeRow) -> str | None:
    """Why the node is drained and until when, as ``tidal nodes`` says it; None when it is not."""
    if node.drain is None:
        return None
    if node.drain == LEASE:
        return f"{node.drain_reason}; until healthy for {span(rule_of(s).healthy_s)}"
    said = f": {node.drain_reason}" if node.drain_reason else ""
    return f"drained by {node.drained_by or 'an admin'}{said}; until `tidal node undrain {node.name}`"


def healthy_since(node: NodeRow) -> float:
    """Since when a node drained for its lost leases has been up with its lease renewed (its registration
    after its last loss), or since its drain."""
    last = max((float(t) for t in node.lease_losses or ()), default=0.0)
    return max(float(node.drained_at or 0.0), float(node.registered_at), last)


def listing(s: Session, node: NodeRow) -> dict[str, Any]:
    """What ``GET /v1/nodes`` says of a node's drain: ``drained`` (``lease`` | ``admin`` | null), ``drain_reason``
    (as :func:`describe`), ``drained_at`` and, drained for its lost leases, ``undrain_at`` (when it is undrained if
    it stays healthy: null while it is down)."""
    out: dict[str, Any] = {"drained": node.drain, "drain_reason": describe(s, node), "drained_at": node.drained_at,
                           "undrain_at": None}
    if node.drain == LEASE and node.up:
        out["undrain_at"] = healthy_since(node) + rule_of(s).healthy_s
    return out


def _healed(s: Session, now: float) -> Any:
    """Nodes drained for their lost leases that have been healthy long enough (a cheap query: the drained
    ones only)."""
    after = now - rule_of(s).healthy_s
    return select(NodeRow).where(NodeRow.drain == LEASE, NodeRow.up.is_(True), NodeRow.drained_at <= after,
                                 NodeRow.registered_at <= after)


def any_healed(s: Session, now: float) -> bool:
    return s.scalar(_healed(s, now).with_only_columns(NodeRow.name).limit(1)) is not None


def undrain_healed(s: Session, now: float, cause: str) -> None:
    """Undrain the nodes drained for their lost leases that have been healthy for the rule's time since."""
    healthy = rule_of(s).healthy_s
    for node in s.scalars(_healed(s, now)):
        since = healthy_since(node)
        if now - since >= healthy:
            _undrain(s, node, cause, f"healthy for {span(healthy)} (up, its lease renewed): it takes jobs again")
