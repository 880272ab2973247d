"""An admin's: join tokens for new nodes, the nodes' own credentials, draining and removing nodes.

A join token is created for one node (``POST /v1/tokens``) and shown once; the node's agent exchanges it
for the node's own credential (``POST /v1/agent/join``). Revoking a node's credential, or removing the
node, makes its agent's next call fail (401): the agent then stops its ranks and exits."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tidal.control import agents, drains, tokens
from tidal.control.api.auth import Admin, forget_principals
from tidal.control.api.context import Ctx
from tidal.control.api.schemas import JoinTokenCreate, NodeDrain
from tidal.control.clock import now
from tidal.errors import NotFound

router = APIRouter(prefix="/v1")


@router.post("/tokens", status_code=201)
def create_join_token(body: JoinTokenCreate, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """A join token for ``node`` (shown once), valid ``ttl`` seconds (default 24 h); with the fingerprint
    agents pin the server's certificate by, where the server knows it (``--tls auto``)."""
    with ctx.db.tx() as s:
        row, token = tokens.create_join(s, body.node, body.ttl or tokens.DEFAULT_JOIN_TTL_S, p.name)
        return {"id": row.id, "node": row.node, "token": token, "expires_at": row.expires_at,
                "fingerprint": ctx.fingerprint}


@router.get("/tokens")
def list_tokens(p: Admin, ctx: Ctx) -> list[dict[str, Any]]:
    """Join tokens (``active``, ``used``, ``expired`` or ``revoked``) and agent credentials (``kind``: node's
    own, or ``cluster``); never a token itself."""
    with ctx.db.read() as s:
        return tokens.list_tokens(s)


@router.delete("/tokens/{token_id}")
def revoke_join_token(token_id: str, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Revoke a join token not yet used; its ``state`` after (a used one stays ``used``: the node's
    credential is revoked with ``DELETE /v1/nodes/{node}/credential``)."""
    with ctx.db.tx() as s:
        row = tokens.revoke_join(s, token_id)
        return {"id": row.id, "node": row.node, "state": tokens.join_state(row, now(s))}


@router.delete("/nodes/{node}/credential")
def revoke_node_credential(node: str, request: Request, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Revoke the node's own credential and its join tokens not yet used."""
    with ctx.db.tx() as s:
        out = tokens.revoke_node(s, node)
    forget_principals(request)
    if not out["credential"] and not out["join_tokens"]:
        raise NotFound(f"node {node} has no credential of its own and no join token to revoke", node=node,
                       hint="`tidal token ls` lists them; an agent started with the cluster token (`tidal up`) "
                            "is stopped with `tidal down`")
    return out


@router.delete("/nodes/{node}")
def remove_node(node: str, request: Request, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Revoke the node's credential and join tokens, and forget the node once it is down (``removed``).
    While it is up, its agent stops at its next call and the node goes down when its lease runs out
    (``lease_left_s``): ask again then."""
    with ctx.db.tx() as s:
        out = {**tokens.revoke_node(s, node), **agents.remove(s, node)}
    forget_principals(request)
    if not out.pop("known") and not out["credential"] and not out["join_tokens"]:
        raise NotFound(f"no node {node}", node=node, hint="`tidal nodes` lists them")
    return out


@router.post("/nodes/{node}/drain")
def drain_node(node: str, p: Admin, ctx: Ctx, body: NodeDrain | None = None) -> dict[str, Any]:
    """Drain the node: nothing new is placed or restored there, while its jobs run on, until an admin
    undrains it (``reason``: shown by ``GET /v1/nodes``). The node's drain fields after."""
    with ctx.db.tx() as s:
        return drains.drain(s, node, body.reason if body else None, p.name, now(s), f"api:{p.name}")


@router.post("/nodes/{node}/undrain")
def undrain_node(node: str, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Undrain the node, whoever drained it (its lease losses so far are forgotten). The node's drain fields
    after."""
    with ctx.db.tx() as s:
        return drains.undrain(s, node, p.name, now(s), f"api:{p.name}")
