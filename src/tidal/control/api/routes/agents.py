"""The node agents' side, /v1/agent/*: registration, heartbeats, the long-poll for actions, their
results, rank exits and log uploads. Every route takes an agent credential, for the node it names."""

from __future__ import annotations

import functools
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi import Path as PathParam

from tidal.control import agents, tokens
from tidal.control.api.auth import Agent, bearer, for_node, forget_principals
from tidal.control.api.context import Context, Ctx
from tidal.control.api.lanes import HEARTBEATS, ActionSignal, agent_lane, in_batch
from tidal.control.api.schemas import ActionResult, AgentHello, CommitReport, ExitReport, Heartbeat, Join, Register
from tidal.core import limits, protocol

router = APIRouter(prefix="/v1/agent")


@router.post("/join")
async def join(body: Join, request: Request, ctx: Ctx,
               authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
    """A new node's agent, presenting a join token for its node as its bearer token, gets the node's own
    credential (once: the join token is used up; a credential the node had before stops working)."""
    token = bearer(authorization)

    def run() -> str:
        with ctx.db.tx(urgent=True) as s:
            return tokens.join(s, token, body.name)

    credential = await agent_lane(request, run)
    forget_principals(request)
    return {"node": body.name, "token": credential}


@router.post("/register")
async def register(body: Register, request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    """The node's agent takes the node's lease. It is told how long a lease lasts, and the checkpoint store
    of its region where the control plane was given one (else it uses its own setting)."""
    for_node(p, body.name)

    def run() -> None:
        with ctx.db.tx(urgent=True) as s:
            agents.register(s, name=body.name, region=body.region, cluster=body.cluster, devices=body.devices,
                            cpus=body.cpus, agent_id=body.agent_id, lease_s=ctx.lease_s,
                            advertise_addr=body.advertise_addr,
                            gpus=[protocol.encode(g) for g in body.gpus] if body.gpus is not None else None)

    await agent_lane(request, run)
    return {"lease_s": ctx.lease_s, "store": ctx.stores.for_region(body.region)}


@router.post("/{node}/heartbeat")
async def heartbeat(node: str, body: Heartbeat, request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    for_node(p, node)
    work = functools.partial(agents.heartbeat, name=node, agent_id=body.agent_id, lease_s=ctx.lease_s,
                             progress=body.jobs)
    await in_batch(request, HEARTBEATS, work, db=ctx.db, urgent=True, notify=False, key=(node, body.agent_id))
    if body.node:  # the node's holder said so (else the heartbeat was refused above)
        request.app.state.node_figures.report(node, body.node)
    return {"lease_s": ctx.lease_s}


@router.get("/{node}/actions")
async def take_actions(node: str, agent_id: str, request: Request, p: Agent, ctx: Ctx,
                       wait: Annotated[float, Query(ge=0, le=limits.MAX_POLL_WAIT_S)] = 0.0) -> list[dict[str, Any]]:
    """The node's actions, handed out once each; none yet: wait up to ``wait`` seconds for some (on the event
    loop, where the app serves with its lifespan: a long-poll holds no thread)."""
    for_node(p, node)
    signal: ActionSignal | None = getattr(request.app.state, "action_signal", None)
    if signal is None:
        return await agent_lane(request, _take_actions, ctx, node, agent_id, wait)
    deadline = signal.loop.time() + wait
    while True:
        seen = signal.woken.get(node, 0)
        if await agent_lane(request, _has_actions, ctx, node, agent_id):
            return await agent_lane(request, _hand_out, ctx, node, agent_id)
        left = deadline - signal.loop.time()
        if left <= 0:
            return []
        await signal.changed(node, seen, left)  # until a commit makes actions for this node


def _has_actions(ctx: Context, node: str, agent_id: str) -> bool:
    """Whether the node has actions for its agent (a process that no longer holds the node's lease is told so:
    409, as at a hand-out)."""
    with ctx.db.read() as s:
        agents.holds(s, node, agent_id)
        return agents.has_actions(s, node)


def _hand_out(ctx: Context, node: str, agent_id: str) -> list[dict[str, Any]]:
    with ctx.db.tx(notify=False, urgent=True) as s:
        return agents.take_actions(s, node, agent_id)


def _take_actions(ctx: Context, node: str, agent_id: str, wait: float) -> list[dict[str, Any]]:
    """The long-poll on a thread, waiting on the database's condition (an app served without its lifespan)."""
    db = ctx.db
    deadline = time.monotonic() + wait
    with db.changed:
        while True:
            seen = db.action_generation
            with db.read() as s:
                ready = agents.has_actions(s, node)
            if ready:
                break
            # Sleep until some commit creates actions (not on every commit: submissions are many).
            def acted(seen: int = seen) -> bool:
                return db.action_generation != seen

            if not db.changed.wait_for(acted, timeout=max(0.0, deadline - time.monotonic())):
                break
    return _hand_out(ctx, node, agent_id)


@router.post("/{node}/leave")
async def leave(node: str, body: AgentHello, request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    for_node(p, node)

    def run() -> None:
        with ctx.db.tx(urgent=True) as s:
            agents.expire(s, agents.holder(s, node, body.agent_id), "its agent stopped")

    await agent_lane(request, run)
    return {"ok": True}


@router.post("/{node}/results")
async def action_result(node: str, body: ActionResult, request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    for_node(p, node)

    def run() -> bool:
        with ctx.db.tx(urgent=True) as s:
            return agents.result(s, node, body.agent_id, body.action_id, body.ok, body.data, body.error, ctx.keep)

    return {"applied": await agent_lane(request, run)}


@router.post("/{node}/exits")
async def exits(node: str, body: ExitReport, request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    for_node(p, node)

    def run() -> bool:
        with ctx.db.tx(urgent=True) as s:
            return agents.exited(s, node, body.agent_id, body.job_id, body.attempt,
                                 [r.model_dump() for r in body.ranks], ctx.keep)

    return {"applied": await agent_lane(request, run)}


@router.post("/{node}/commits")
async def commits(node: str, body: CommitReport, request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    for_node(p, node)

    def run() -> bool:
        with ctx.db.tx(urgent=True) as s:
            return agents.commit_reported(s, node, body, ctx.keep)

    return {"applied": await agent_lane(request, run)}


@router.put("/{node}/logs/{job_id}/{rank}")
async def upload_log(node: str, job_id: str, rank: Annotated[int, PathParam(ge=0, lt=limits.MAX_RANKS)],
                     agent_id: str, attempt: int, offset: Annotated[int, Query(ge=0, le=limits.MAX_LOG_OFFSET)],
                     request: Request, p: Agent, ctx: Ctx) -> dict[str, Any]:
    for_node(p, node)
    data = await request.body()  # at most MAX_LOG_UPLOAD_BYTES (BodyLimit)

    def run() -> bool:
        with ctx.db.tx(notify=False, urgent=True) as s:
            return agents.write_log(s, ctx.home, node, agent_id, job_id, attempt, rank, offset, data)

    return {"applied": await agent_lane(request, run)}
