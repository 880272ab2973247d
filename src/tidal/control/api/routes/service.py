"""The service itself: health, and who a token is (user accounts: :mod:`.users`)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from tidal.control.api.auth import AnyToken

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"ok": True, "time": time.time()}


@router.get("/v1/whoami")
def whoami(p: AnyToken) -> dict[str, str]:
    return {"name": p.name, "role": p.role}
