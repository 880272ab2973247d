"""The agent's connection to the control plane: authenticated HTTP with patient retries.

Retries never give up on a control plane that is down or restarting (its agents and their ranks keep
running meanwhile). A refusal is raised as the error the control plane named: a 409 LeaseLost
(:class:`tidal.errors.LeaseLost`: this agent was fenced and must stop its ranks), a 426
(:class:`tidal.errors.ProtocolMismatch`: the control plane speaks another protocol version), any other
(:class:`Refused`; a 401, the credential refused, first tells ``on_unauthorized``). A control plane whose
certificate this agent does not trust is not retried either (:class:`Untrusted`)."""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx

from tidal.core import protocol
from tidal.errors import LeaseLost, ProtocolMismatch, TidalError
from tidal.tls import untrusted_reason

log = logging.getLogger(__name__)


class Refused(TidalError):
    """The control plane refused a request: ``status`` is its HTTP status, ``error`` the error it named."""


class Unreachable(TidalError):
    """The control plane could not be reached (and the call was not to be retried)."""


class Untrusted(TidalError):
    """The control plane's certificate is not the one this agent was told to trust (``--ca``,
    ``--ca-fingerprint``)."""


class ControlClient:
    def __init__(self, url: str, token: str, node: str, verify: ssl.SSLContext | bool = True) -> None:
        """``verify``: what the control plane's certificate is checked against (see :mod:`tidal.tls`)."""
        self.node = node
        self.verify = verify
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                 verify=verify)
        self.closed = False
        # Called with the refusal when the control plane answers 401: this agent's credential is not (or no
        # longer) valid.
        self.on_unauthorized: Callable[[TidalError], None] | None = None

    def call(self, method: str, path: str, *, retry: bool = True, **kw: Any) -> Any:
        delay = 0.1
        while True:
            try:
                r = self.http.request(method, path, **kw)
            except httpx.TransportError as exc:
                reason = untrusted_reason(exc)
                if reason is not None:
                    raise Untrusted(f"refusing to talk to the control plane at {self.http.base_url}: its "
                                    f"certificate is not trusted ({reason})",
                                    hint="give the agent the control plane's CA with --ca FILE, or its fingerprint "
                                         "with --ca-fingerprint (both as `tidal server` printed them)") from exc
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
                err = refusal(r)
                if r.status_code == 401 and self.on_unauthorized is not None:
                    self.on_unauthorized(err)
                raise err
            return r.json()

    def send(self, path: str, msg: protocol.Message, **kw: Any) -> Any:
        """POST a protocol message (``kw``: as for :meth:`call`, e.g. ``retry``, ``timeout``)."""
        return self.call("POST", path, json=protocol.encode(msg), **kw)


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
