"""The control plane's client: where the API is, which token to send, which certificate to trust, and its
errors as TidalErrors.

Settings (environment): ``TIDAL_URL`` (else the local cluster's, from ``tidal up``'s state file),
``TIDAL_TOKEN`` (else the local cluster's user token, or for admin commands its admin token), and for an
``https`` control plane whose certificate is not signed by a CA the system trusts: ``TIDAL_CA`` (the CA's
PEM file) or ``TIDAL_CA_FINGERPRINT`` (the SHA-256 fingerprint `tidal server` prints; see :mod:`tidal.tls`).

It speaks HTTP only, with the standard library's :mod:`http.client` (every command of the CLI starts by
making one: an HTTP library's import would take longer than most commands' work). What it may import is fixed
by a contract in ``pyproject.toml``: nothing of the control plane but :mod:`tidal.control.clusterfile`, the
local cluster's state file that says where the API listens. The CLI reaches the control plane through it
alone.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from tidal.control.clusterfile import load, tidal_home, token_path
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
from tidal.proxies import Proxy, proxy_for
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


def trust(ca: str | None = None, pin: str | None = None) -> ssl.SSLContext | bool:
    """What the client verifies the control plane's certificate with: the CA file ``ca`` or the fingerprint
    ``pin`` given, else TIDAL_CA or TIDAL_CA_FINGERPRINT; True: the default trust (:func:`default_context`)."""
    if ca is None and pin is None:
        ca, pin = os.environ.get("TIDAL_CA") or None, os.environ.get("TIDAL_CA_FINGERPRINT") or None
    return client_context(ca=ca, pin=pin) or True


class Response:
    """An answer of the control plane, read whole: ``status_code``, ``headers`` (names in any case) and
    ``content``; ``text`` and ``json()`` decode it."""

    def __init__(self, status_code: int, headers: http.client.HTTPMessage, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode(self.headers.get_content_charset() or "utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class Client:
    """An authenticated HTTP client of the control-plane API. ``get``/``post`` return the decoded JSON;
    an error status raises the matching :class:`TidalError` with the server's message and hint.

    HTTP/1.1 over the standard library's :mod:`http.client` (a command of the CLI starts in a fraction of the
    time an HTTP library's import takes): connections kept alive and reused, one at a time by each thread;
    TLS as :func:`trust` says; the proxies of the environment (:mod:`tidal.proxies`) as before."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60,
                 who: str = "user", ca: str | None = None, ca_fingerprint: str | None = None) -> None:
        """``who``: whose token a local cluster's files give where TIDAL_TOKEN is unset (``admin`` for the
        admin's commands). ``ca``/``ca_fingerprint``: how to trust the server, over TIDAL_CA/TIDAL_CA_FINGERPRINT."""
        home = tidal_home()
        self.url = endpoint(home) if url is None else url
        token = user_token(home, who) if token is None else token
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": "tidal"}
        self.timeout = timeout
        self.verify: ssl.SSLContext | bool = trust(ca, ca_fingerprint)
        self._origin: _Origin | None = None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
                headers: Mapping[str, str] | None = None) -> Response:
        origin = self._where()
        body = None if json is None else _json_body(json)
        sent = self._headers(origin, {"Content-Type": "application/json"} if body is not None else {}, headers or {})
        conn = self._connection(origin)
        try:
            conn.request(method, origin.target(path, params), body=body, headers=sent)
            r = conn.getresponse()
            content = r.read()
        except _TRANSPORT_ERRORS as exc:
            conn.close()
            reason = untrusted_reason(exc)
            if reason is not None:
                raise UntrustedServer(f"refusing to talk to the control plane at {self.url}: its certificate is not "
                                      f"trusted ({reason})", hint=TRUST_HINT) from None
            raise ControlPlaneError(f"cannot reach the control plane at {self.url} ({_why(exc)})",
                                    hint="is it running? `tidal status`; or check TIDAL_URL") from None
        self._done(conn, r)
        if r.status >= 400:
            raise error_for(r.status, _error_body(content), Response(r.status, r.headers, content).text)
        return Response(r.status, r.headers, content)

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
        origin = self._where()
        sent = self._headers(origin, headers)
        # A connection of its own: the caller's requests go on on others while the stream is open.
        conn = self._open(origin)
        try:
            conn.request("GET", origin.target(path, query), headers=sent)
            r = conn.getresponse()
            if r.status >= 400:
                content = r.read()
                raise error_for(r.status, _error_body(content), Response(r.status, r.headers, content).text)
            for data in sse_data(_lines(r)):
                yield json.loads(data)
        except _TRANSPORT_ERRORS as exc:
            raise ControlPlaneError(f"lost the event stream of the control plane at {self.url} ({_why(exc)})",
                                    hint="is it running? `tidal status`; or check TIDAL_URL") from None
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _headers(self, origin: _Origin, *more: Mapping[str, str]) -> dict[str, str]:
        """A request's headers: the token's, a proxy's own where a plain-HTTP request goes through it (a tunnel's
        CONNECT carries them for HTTPS), then ``more``."""
        proxy = origin.proxy_headers if origin.proxy and origin.scheme == "http" else {}
        return {k: v for m in (self.headers, proxy, *more) for k, v in m.items()}

    def _where(self) -> _Origin:
        if self._origin is None:
            self._origin = _Origin.of(self.url)
        return self._origin

    def _connection(self, origin: _Origin) -> http.client.HTTPConnection:
        """An idle connection the server has not closed meanwhile (a keep-alive times out), else a new one."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.sock is not None and not _readable(conn.sock):
                    return conn
                conn.close()
        return self._open(origin)

    def _open(self, origin: _Origin) -> http.client.HTTPConnection:
        host, port = (origin.proxy.host, origin.proxy.port) if origin.proxy else (origin.host, origin.port)
        if origin.scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._context())
        if origin.proxy:
            conn.set_tunnel(origin.host, origin.port, headers=origin.proxy_headers)
        return conn

    def _context(self) -> ssl.SSLContext:
        if self.verify is True:
            self.verify = default_context()
        assert isinstance(self.verify, ssl.SSLContext)
        return self.verify

    def _done(self, conn: http.client.HTTPConnection, r: http.client.HTTPResponse) -> None:
        """Keep the connection for the next request, unless the server closes it."""
        if r.will_close:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < _KEPT_ALIVE:
                self._idle.append(conn)
                return
        conn.close()


#: Idle connections kept for the next requests (one per thread that makes requests at once).
_KEPT_ALIVE = 8
# What fails a request on its way: the network, TLS, or an answer that is not HTTP.
_TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


def _why(exc: BaseException) -> str:
    """A failure in words, as it was told before (httpx's words where the standard library's differ)."""
    if isinstance(exc, http.client.RemoteDisconnected):
        return "Server disconnected without sending a response."
    return str(exc) or type(exc).__name__


def _error_body(content: bytes) -> dict[str, Any]:
    try:
        body = json.loads(content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _json_body(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection's socket has something to read: the server closed it (or broke the protocol)."""
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


def _lines(r: http.client.HTTPResponse) -> Iterator[str]:
    while line := r.readline():
        yield line.decode("utf-8", errors="replace").rstrip("\r\n")


def default_context() -> ssl.SSLContext:
    """The trust of a server where neither a CA file nor a fingerprint is given: ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` where set, else certifi's CA bundle where it is installed (httpx's choice, which the CLI
    made before), else the system's trust store."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


class _Origin:
    """Where requests go: the control plane's scheme, host, port and path prefix, and the proxy on the way."""

    def __init__(self, scheme: str, host: str, port: int, prefix: str, proxy: Proxy | None) -> None:
        self.scheme, self.host, self.port, self.prefix, self.proxy = scheme, host, port, prefix, proxy
        self.proxy_headers = proxy.headers() if proxy else {}

    @classmethod
    def of(cls, url: str) -> _Origin:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            # Raised where a request is made, as a failure to reach the control plane (as it was before).
            why = (f"Request URL has an unsupported protocol '{scheme}://'." if scheme else
                   "Request URL is missing an 'http://' or 'https://' protocol.")
            raise ControlPlaneError(f"cannot reach the control plane at {url} ({why})",
                                    hint="is it running? `tidal status`; or check TIDAL_URL")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as exc:
            raise ConfigError(f"the control plane's URL {url!r} is not valid ({exc})", field="url",
                              hint="give it as http(s)://HOST[:PORT]") from None
        host = parts.hostname or ""
        return cls(scheme, host, port, parts.path.rstrip("/"), proxy_for(scheme, host, port))

    def target(self, path: str, params: Mapping[str, Any] | None) -> str:
        """The request's target: the path under the URL's own, quoted as a URL's path is, and its query."""
        p = urlsplit(path)
        query = [q for q in (p.query, _query(params or {})) if q]
        target = quote(self.prefix + "/" + p.path.lstrip("/"), safe=_PATH_SAFE) + ("?" + "&".join(query) if query
                                                                                   else "")
        if self.proxy and self.scheme == "http":  # a proxy is asked for the whole URL
            netloc = f"[{self.host}]" if ":" in self.host else self.host
            return f"http://{netloc}:{self.port}{target}"
        return target


# The characters a URL's path keeps as they are (httpx's set): the rest is percent-encoded.
_PATH_SAFE = "".join(chr(i) for i in range(0x21, 0x7F) if chr(i) not in "\"#<>?`{}")


def _query(params: Mapping[str, Any]) -> str:
    """A query string of ``params`` as httpx wrote it: booleans as ``true``/``false``, None as empty, a list as
    its items under one name."""
    def text(v: Any) -> str:
        return "true" if v is True else "false" if v is False else "" if v is None else str(v)

    pairs = [(k, text(item)) for k, v in params.items() for item in (v if isinstance(v, list | tuple) else [v])]
    return urlencode(pairs)


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
