"""The control plane's client: where the API is, which token to send, which certificate to trust, and its
errors as TidalErrors.

Settings (environment): ``TIDAL_URL`` (else the local cluster's, from ``tidal up``'s state file),
``TIDAL_TOKEN`` (else the local cluster's user token, or for admin commands its admin token), and for an
``https`` control plane whose certificate is not signed by a CA the system trusts: ``TIDAL_CA`` (the CA's
PEM file) or ``TIDAL_CA_FINGERPRINT`` (the SHA-256 fingerprint `tidal server` prints; see :mod:`tidal.tls`).

It speaks HTTP only. What it may import is fixed by a contract in ``pyproject.toml``: nothing of the control
plane but :mod:`tidal.control.clusterfile`, the local cluster's state file that says where the API listens.
The CLI reaches the control plane through it alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tidal.config import load_settings
from tidal.control.clusterfile import load, token_path
from tidal.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    TidalError,
    TooManyRequests,
    Unauthorized,
    Unsupported,
    ValidationError,
)
from tidal.tls import client_context, untrusted_reason


class ControlPlaneError(TidalError):
    """The control plane could not be reached, or failed to answer (a 5xx status)."""

    status_code = 502


_BY_STATUS: dict[int, type[TidalError]] = {400: ValidationError, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                           409: Conflict, 413: PayloadTooLarge, 422: ValidationError,
                                           429: TooManyRequests, 501: Unsupported}


def error_for(status: int, body: dict[str, Any], text: str = "") -> TidalError:
    """The TidalError an error response stands for: its class by HTTP status, its fields from the body."""
    cls = _BY_STATUS.get(status, ValidationError if status < 500 else ControlPlaneError)
    fields = {k: v for k, v in body.items() if k not in ("error", "message", "hint")}
    message = str(body.get("message") or body.get("detail") or text or f"HTTP {status}")
    hint = body.get("hint")
    if hint is None and cls is ControlPlaneError:
        hint = "see the control plane's log (TIDAL_HOME/logs/control.log for a local cluster)"
    return cls(message, hint=hint, **fields)


def endpoint(home: Path) -> str:
    """The API's URL: ``TIDAL_URL``, else the local cluster's (``tidal up``)."""
    url = os.environ.get("TIDAL_URL")
    if url is not None:
        return url
    state = load(home)
    if state is None:
        raise ConfigError("no control plane is configured",
                          hint="start a local cluster with `tidal up`, or give the control plane's url and your token "
                                "in ~/.config/tidal/config (or TIDAL_URL and TIDAL_TOKEN)")
    return state.url


def user_token(home: Path, who: str = "user") -> str:
    """``TIDAL_TOKEN``, else the token a local cluster (or `tidal server`, for the admin) wrote for ``who``."""
    token = os.environ.get("TIDAL_TOKEN")
    if token is not None:
        return token
    path = token_path(home, who)
    if not path.exists():
        raise Unauthorized(f"no {'admin ' if who == 'admin' else ''}API token",
                           hint=f"give your token in ~/.config/tidal/config (token = ...) or TIDAL_TOKEN, or run "
                                f"`tidal up` to create {path}")
    return path.read_text().strip()


class UntrustedServer(ControlPlaneError):
    """The control plane's certificate is not one this client trusts: it refuses to talk to it."""


TRUST_HINT = ("give its CA certificate with TIDAL_CA=FILE (`tidal server --tls auto` writes TIDAL_HOME/tls/ca.pem), "
              "or pin it with TIDAL_CA_FINGERPRINT=SHA256 (the fingerprint `tidal server` printed)")


def trust(ca: str | None = None, pin: str | None = None) -> Any:
    """What the client verifies the control plane's certificate with (``httpx``'s ``verify``): the CA file ``ca``
    or the fingerprint ``pin`` given, else TIDAL_CA or TIDAL_CA_FINGERPRINT, else the system's trust store."""
    if ca is None and pin is None:
        ca, pin = os.environ.get("TIDAL_CA") or None, os.environ.get("TIDAL_CA_FINGERPRINT") or None
    return client_context(ca=ca, pin=pin) or True


class Client:
    """An authenticated HTTP client of the control-plane API. ``get``/``post`` return the decoded JSON;
    an error status raises the matching :class:`TidalError` with the server's message and hint."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60,
                 who: str = "user", ca: str | None = None, ca_fingerprint: str | None = None) -> None:
        """``who``: whose token a local cluster's files give where TIDAL_TOKEN is unset (``admin`` for the
        admin's commands). ``ca``/``ca_fingerprint``: how to trust the server, over TIDAL_CA/TIDAL_CA_FINGERPRINT."""
        home = Path(load_settings().home)
        self.url = endpoint(home) if url is None else url
        token = user_token(home, who) if token is None else token
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
                                 verify=trust(ca, ca_fingerprint))

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            reason = untrusted_reason(exc)
            if reason is not None:
                raise UntrustedServer(f"refusing to talk to the control plane at {self.url}: its certificate is not "
                                      f"trusted ({reason})", hint=TRUST_HINT) from None
            raise ControlPlaneError(f"cannot reach the control plane at {self.url} ({exc})",
                                    hint="is it running? `tidal status`; or check TIDAL_URL") from None
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {}
            raise error_for(r.status_code, body if isinstance(body, dict) else {}, r.text)
        return r

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw).json()

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw).json()

    def stream(self, path: str, *, after: int | None = None, **params: Any) -> Iterator[dict[str, Any]]:
        """The server-sent events of ``path`` (``GET /v1/events/stream``), each message's ``data`` decoded, as
        they come. ``after``: resume after that event's ``seq`` (sent as ``Last-Event-ID``). It ends when the
        server closes the stream; a lost connection raises :class:`ControlPlaneError` (resume from the last
        ``seq`` seen)."""
        headers = {"Last-Event-ID": str(after)} if after is not None else {}
        query = {k: v for k, v in params.items() if v is not None}
        try:
            with self.http.stream("GET", path, params=query, headers=headers) as r:
                if r.status_code >= 400:
                    r.read()
                    try:
                        body = r.json()
                    except ValueError:
                        body = {}
                    raise error_for(r.status_code, body if isinstance(body, dict) else {}, r.text)
                for data in sse_data(r.iter_lines()):
                    yield json.loads(data)
        except httpx.TransportError as exc:
            raise ControlPlaneError(f"lost the event stream of the control plane at {self.url} ({exc})",
                                    hint="is it running? `tidal status`; or check TIDAL_URL") from None

    def close(self) -> None:
        self.http.close()


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` of each message of a server-sent event stream, given its lines (comments and other fields
    are skipped; a message's several ``data`` lines are joined by newlines)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)
