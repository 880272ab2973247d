"""The checkpoint store as users see it: what their checkpoints take (``GET /v1/store/usage``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from tidal.control import retention
from tidal.control.api.auth import User
from tidal.control.api.context import Ctx

router = APIRouter(prefix="/v1/store")


@router.get("/usage")
def usage(p: User, ctx: Ctx, all_users: Annotated[bool, Query(alias="all")] = False) -> dict[str, Any]:
    """Bytes of the checkpoints kept, per user (with their store quota, null: none) and per job: the caller's,
    or every user's for an admin who asks for ``all``."""
    with ctx.db.read() as s:
        out = retention.usage(s, p.name if p.owner_filter is not None or not all_users else None)
    for u in out["users"]:
        u["quota"] = ctx.retention.quota(u["user"])
    return out
