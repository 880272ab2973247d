"""The agent's connection to the control plane: authenticated HTTP with patient retries.

Retries never give up on a control plane that is down or restarting (its agents and their ranks keep
running meanwhile); a 409 LeaseLost means this agent was fenced and must stop its ranks."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)


class LeaseLostError(Exception):
    pass


class ControlClient:
    def __init__(self, url: str, token: str, node: str) -> None:
        self.node = node
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        self.closed = False

    def call(self, method: str, path: str, *, retry: bool = True, **kw: Any) -> Any:
        delay = 0.1
        while True:
            try:
                r = self.http.request(method, path, **kw)
            except httpx.TransportError as exc:
                if not retry or self.closed:
                    raise
                log.debug("control plane unreachable (%s); retrying", exc)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if r.status_code == 409 and r.json().get("error") == "LeaseLost":
                raise LeaseLostError(r.json().get("message"))
            if r.status_code >= 500 and retry and not self.closed:
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if r.status_code >= 400:
                raise httpx.HTTPStatusError(f"{r.status_code}: {r.text}", request=r.request, response=r)
            return r.json()
