"""The service itself: health, who a token is, and user accounts (admins)."""

from __future__ import annotations

import pwd
import time
from typing import Any

from fastapi import APIRouter

from tidal.control import tokens
from tidal.control.api.auth import Admin, AnyToken
from tidal.control.api.context import Ctx
from tidal.control.api.schemas import UserCreate
from tidal.errors import ValidationError

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"ok": True, "time": time.time()}


@router.get("/v1/whoami")
def whoami(p: AnyToken) -> dict[str, str]:
    return {"name": p.name, "role": p.role}


@router.post("/v1/users", status_code=201)
def create_user(body: UserCreate, p: Admin, ctx: Ctx) -> dict[str, str]:
    if body.unix_user is not None:
        try:
            pwd.getpwnam(body.unix_user)
        except KeyError:
            raise ValidationError(f"no Unix account {body.unix_user!r}", field="unix_user") from None
    with ctx.db.tx() as s:
        token = tokens.create_user(s, body.name, body.role, body.unix_user)
    return {"name": body.name, "role": body.role, "token": token}
