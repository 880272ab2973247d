"""The agent's connection to the control plane: authenticated HTTP with patient retries.

Retries never give up on a control plane that is down or restarting (its agents and their ranks keep
running meanwhile). A refusal is raised as the error the control plane named: a 409 LeaseLost
(:class:`tidal.errors.LeaseLost`: this agent was fenced and must stop its ranks), a 426
(:class:`tidal.errors.ProtocolMismatch`: the control plane speaks another protocol version), any other
(:class:`Refused`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from tidal.core import protocol
from tidal.errors import LeaseLost, ProtocolMismatch, TidalError

log = logging.getLogger(__name__)


class Refused(TidalError):
    """The control plane refused a request: ``status`` is its HTTP status, ``error`` the error it named."""


class Unreachable(TidalError):
    """The control plane could not be reached (and the call was not to be retried)."""


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
                    raise Unreachable(f"the control plane at {self.http.base_url} is unreachable: {exc}",
                                      hint="check that it runs and that this node can reach it") from exc
                log.debug("control plane unreachable (%s); retrying", exc)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if r.status_code >= 500 and retry and not self.closed:
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if r.status_code >= 400:
                raise refusal(r)
            return r.json()

    def send(self, path: str, msg: protocol.Message) -> Any:
        """POST a protocol message."""
        return self.call("POST", path, json=protocol.encode(msg))


def refusal(r: httpx.Response) -> TidalError:
    """The error a refused request is raised as, with the message and hint the control plane gave."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    message = str(body.get("message") or f"{r.status_code}: {r.text[:500]}")
    hint = body.get("hint") if isinstance(body.get("hint"), str) else None
    if r.status_code == 409 and body.get("error") == "LeaseLost":
        return LeaseLost(message, hint=hint or "stop the node's ranks and register again")
    if r.status_code == 426:
        return ProtocolMismatch(message, hint=hint or "run the same Tidal release on the control plane and its "
                                "agents", version=body.get("version"), accepted=body.get("accepted"))
    return Refused(f"the control plane refused {r.request.method} {r.request.url.path}: {message}",
                   hint=hint or "see the control plane's log", status=r.status_code, error=body.get("error"))
