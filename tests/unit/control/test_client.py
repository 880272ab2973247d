"""The control plane's client: where it finds the API and its token, the API's errors as TidalErrors, and how
it speaks HTTP (the standard library's, keep-alive, TLS with a CA file or a pinned fingerprint, proxies),
against real HTTP(S) servers on loopback that answer as the control plane would."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tidal.control import pki
from tidal.control.client import Client, ControlPlaneError, UntrustedServer, endpoint, error_for, trust, user_token
from tidal.control.clusterfile import ClusterState, Proc, state_path, tidal_home, token_path
from tidal.errors import ConfigError, Conflict, NotFound, TidalError, Unauthorized, ValidationError
from tidal.waiting import wait_until


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TIDAL_URL", "TIDAL_TOKEN", "TIDAL_CA", "TIDAL_CA_FINGERPRINT", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.upper(), raising=False)
    monkeypatch.setenv("TIDAL_HOME", str(tmp_path))
    return tmp_path


def test_the_endpoint_is_tidal_url_else_the_local_cluster(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as no_cluster:
        endpoint(home)
    assert no_cluster.value.hint and "tidal up" in no_cluster.value.hint
    state_path(home).write_text(json.dumps(ClusterState("http://127.0.0.1:7001", 7001, Proc(1, [], "")).to_json()))
    assert endpoint(home) == "http://127.0.0.1:7001"
    monkeypatch.setenv("TIDAL_URL", "http://elsewhere:1")
    assert endpoint(home) == "http://elsewhere:1"


def test_the_token_is_tidal_token_else_the_local_clusters(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Unauthorized) as none:
        user_token(home)
    assert none.value.hint and str(token_path(home, "user")) in none.value.hint
    token_path(home, "user").parent.mkdir()
    token_path(home, "user").write_text("tdl_file\n")
    assert user_token(home) == "tdl_file"
    monkeypatch.setenv("TIDAL_TOKEN", "tdl_env")
    assert user_token(home) == "tdl_env"


@pytest.mark.parametrize("environ", [{}, {"TIDAL_HOME": "/h"}, {"tidal_home": "/x"},
                                     {"TIDAL_HOME": "/a", "tidal_home": "/b"}, {"tidal_home": "/b", "TIDAL_HOME": "/a"},
                                     {"TIDAL_HOME": ""}, {"TIDAL_HOME": "~/q"}])
def test_tidal_home_is_read_as_the_settings_read_it(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tidal.config import Settings

    for name in [k for k in os.environ if k.lower() == "tidal_home"]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert tidal_home() == Settings().home


@pytest.mark.parametrize(("status", "cls"), [(400, ValidationError), (401, Unauthorized), (404, NotFound),
                                             (409, Conflict), (422, ValidationError), (418, ValidationError),
                                             (500, ControlPlaneError), (503, ControlPlaneError)])
def test_an_error_status_is_a_tidal_error(status: int, cls: type[TidalError]) -> None:
    err = error_for(status, {"error": "X", "message": "it went wrong", "hint": "do this", "job": "j-1"})
    assert type(err) is cls and err.message == "it went wrong" and err.hint == "do this"
    assert err.fields == {"job": "j-1"}


def test_a_server_error_without_a_hint_points_at_the_log() -> None:
    err = error_for(500, {}, "Internal Server Error")
    assert isinstance(err, ControlPlaneError) and err.message == "Internal Server Error"
    assert err.hint and "control.log" in err.hint


class _Seen:
    """What a test server was asked: each request's line, headers and body, and the client's port (one per
    connection)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.closed = threading.Event()


class _Api(BaseHTTPRequestHandler):
    """The control plane's answers, as far as these tests need them."""

    protocol_version = "HTTP/1.1"  # keep-alive
    seen: _Seen
    hang_up_after_answer = False

    def _answer(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Tidal-Log-Size", "7")
        self.end_headers()
        self.wfile.write(body)
        if self.hang_up_after_answer:  # as a keep-alive that timed out: closed without a word
            self.close_connection = True

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.requests.append({"line": self.requestline, "path": self.path, "headers": dict(self.headers),
                                   "body": body, "port": self.client_address[1]})
        if self.path.startswith("/v1/jobs/j-1") or self.path.startswith("/prefix/v1/jobs/j-1"):
            self._answer(200, json.dumps({"id": "j-1"}).encode())
        elif self.path.startswith("/v1/echo"):
            self._answer(200, json.dumps({"path": self.path, "body": body.decode()}).encode())
        elif self.path.startswith("/v1/boom"):
            self._answer(502, b"<html>bad gateway</html>", "text/html")
        elif self.path.startswith("/v1/events/stream"):
            self._stream()
        else:
            self._answer(404, json.dumps({"error": "NotFound", "message": "no job j-2", "hint": "tidal ls"}).encode())

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for seq in (4, 5):
            event = f": keep-alive\r\n\r\nid: {seq}\r\ndata: {json.dumps({'seq': seq, 'kind': 'running'})}\r\n\r\n"
            self.wfile.write(f"{len(event):x}\r\n{event}\r\n".encode())
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    do_GET = do_POST = do_DELETE = _handle

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], seen: _Seen) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.seen = seen

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.seen.closed.set()


@contextmanager
def _serve(tls: pki.ServerTLS | None = None, **behaviour: Any) -> Iterator[tuple[str, _Seen]]:
    """A server on a free loopback port (HTTPS presenting ``tls``'s certificate): its URL and what it saw."""
    seen = _Seen()
    handler = type("Handler", (_Api,), {"seen": seen, **behaviour})
    server = _Server(handler, seen)
    scheme = "http"
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls.certfile, tls.keyfile)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://localhost:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_requests_carry_the_token_and_errors_raise(home: Path) -> None:
    with _serve() as (url, seen):
        client = Client(url=url, token="tdl_x")
        assert client.get("/v1/jobs/j-1") == {"id": "j-1"}
        assert seen.requests[0]["headers"]["Authorization"] == "Bearer tdl_x"
        with pytest.raises(NotFound, match="no job j-2") as err:
            client.get("/v1/jobs/j-2")
        assert err.value.hint == "tidal ls"
        with pytest.raises(ControlPlaneError, match="bad gateway"):
            client.post("/v1/boom", json={})
        r = client.request("GET", "/v1/jobs/j-1/logs", params={"rank": 0, "offset": 0})
        assert (r.status_code, r.headers["x-tidal-log-size"], r.content, r.text) == (200, "7", b'{"id": "j-1"}',
                                                                                     '{"id": "j-1"}')
        client.close()


def test_queries_paths_and_bodies_are_written_as_before(home: Path) -> None:
    with _serve() as (url, seen):
        client = Client(url=url, token="tdl_x")
        # Booleans as true/false, None as empty, lists repeated; a path's space percent-encoded.
        echoed = client.get("/v1/echo/a b", params={"all": False, "yes": True, "n": 3, "none": None, "l": [1, 2]})
        assert echoed["path"] == "/v1/echo/a%20b?all=false&yes=true&n=3&none=&l=1&l=2"
        echoed = client.post("/v1/echo", json={"name": "é", "n": 1})
        assert echoed["body"] == '{"name":"é","n":1}'
        assert seen.requests[-1]["headers"]["Content-Type"] == "application/json"
        client.post("/v1/echo")  # no body: an empty one
        assert seen.requests[-1]["headers"]["Content-Length"] == "0"
        # A control plane under a path of its server's (behind a proxy): requests go under it.
        assert Client(url=url + "/prefix/", token="t").get("/v1/jobs/j-1") == {"id": "j-1"}
        assert seen.requests[-1]["path"] == "/prefix/v1/jobs/j-1"


def test_connections_are_kept_alive_and_replaced_once_the_server_closed_them(home: Path) -> None:
    with _serve() as (url, seen):
        client = Client(url=url, token="t")
        for _ in range(3):
            client.get("/v1/jobs/j-1")
        assert len({r["port"] for r in seen.requests}) == 1  # one connection for all three
    with _serve(hang_up_after_answer=True) as (url, seen):
        client = Client(url=url, token="t")
        client.get("/v1/jobs/j-1")
        seen.closed.wait(10)
        idle = client._idle[0].sock
        assert idle is not None
        wait_until(lambda: select.select([idle], [], [], 0)[0], timeout=10, what="the server's close to arrive")
        assert client.get("/v1/jobs/j-1") == {"id": "j-1"}  # on a new connection, without an error
        assert len({r["port"] for r in seen.requests}) == 2


def test_threads_share_a_client(home: Path) -> None:
    # As benchmarks/api.py submits: one client, requests from several threads at once, each on a connection of
    # its own while it is in flight.
    with _serve() as (url, seen):
        client = Client(url=url, token="t")
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: client.get("/v1/jobs/j-1"), range(40)))
        assert answers == [{"id": "j-1"}] * 40 and len(seen.requests) == 40
        assert len({r["port"] for r in seen.requests}) <= 8  # kept alive and reused, not one for each


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_control_plane_says_what_to_check(home: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ControlPlaneError) as err:
        Client(url=url, token="t").get("/v1/nodes")
    assert err.value.message == f"cannot reach the control plane at {url} ([Errno 111] Connection refused)"
    assert err.value.hint == "is it running? `tidal status`; or check TIDAL_URL"


def test_a_server_that_hangs_up_without_an_answer_is_told_as_before(home: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def hang_up() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(ControlPlaneError) as err:
        Client(url=url, token="t").get("/v1/nodes")
    assert err.value.message == (f"cannot reach the control plane at {url} (Server disconnected without sending a "
                                 "response.)")
    listener.close()


def test_a_url_that_is_not_http_is_refused_as_before(home: Path) -> None:
    for url, why in (("localhost:8470", "Request URL has an unsupported protocol 'localhost://'."),
                     ("ftp://host", "Request URL has an unsupported protocol 'ftp://'."),
                     ("//host:1", "Request URL is missing an 'http://' or 'https://' protocol.")):
        with pytest.raises(ControlPlaneError) as err:
            Client(url=url, token="t").get("/v1/nodes")
        assert err.value.message == f"cannot reach the control plane at {url} ({why})"
    with pytest.raises(ConfigError, match="the control plane's URL 'http://host:abc' is not valid"):
        Client(url="http://host:abc", token="t").get("/v1/nodes")


def test_the_certificate_is_trusted_by_tidal_ca_or_tidal_ca_fingerprint(home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert trust() is True  # the default trust
    monkeypatch.setenv("TIDAL_CA_FINGERPRINT", "AB" * 32)
    assert isinstance(trust(), ssl.SSLContext)
    monkeypatch.setenv("TIDAL_CA", str(home / "missing.pem"))
    with pytest.raises(ConfigError, match="not both"):
        trust()
    monkeypatch.delenv("TIDAL_CA_FINGERPRINT")
    with pytest.raises(ConfigError, match="cannot read the CA certificate"):
        trust()


@pytest.fixture
def auto(tmp_path: Path) -> pki.ServerTLS:
    return pki.ensure_auto(tmp_path / "srv", ["localhost", "127.0.0.1"])


def test_https_with_the_ca_file_or_the_pinned_fingerprint(home: Path, auto: pki.ServerTLS,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert auto.ca is not None
    with _serve(auto) as (url, _):
        assert Client(url=url, token="t", ca=str(auto.ca)).get("/v1/jobs/j-1") == {"id": "j-1"}
        pinned = Client(url=url, token="t", ca_fingerprint=auto.fingerprint)
        assert pinned.get("/v1/jobs/j-1") == pinned.get("/v1/jobs/j-1") == {"id": "j-1"}
        # Without either: the default trust (certifi's), which SSL_CERT_FILE replaces, as it did for httpx.
        with pytest.raises(UntrustedServer) as err:
            Client(url=url, token="t").get("/v1/nodes")
        assert err.value.message == (f"refusing to talk to the control plane at {url}: its certificate is not "
                                     "trusted (self-signed certificate in certificate chain)")
        assert err.value.hint and "TIDAL_CA=FILE" in err.value.hint and "TIDAL_CA_FINGERPRINT" in err.value.hint
        monkeypatch.setenv("SSL_CERT_FILE", str(auto.ca))
        assert Client(url=url, token="t").get("/v1/jobs/j-1") == {"id": "j-1"}


def test_a_wrong_pin_is_refused_saying_what_the_server_presented(home: Path, auto: pki.ServerTLS,
                                                                 tmp_path: Path) -> None:
    other = pki.ensure_auto(tmp_path / "other", ["localhost"])
    with _serve(auto) as (url, _), pytest.raises(UntrustedServer) as err:
        Client(url=url, token="t", ca_fingerprint=other.fingerprint).get("/v1/nodes")
    assert err.value.message.startswith(
        f"refusing to talk to the control plane at {url}: its certificate is not trusted (the server presented no "
        f"certificate with the pinned SHA-256 fingerprint {other.fingerprint} (it presented: ")
    assert auto.fingerprint in err.value.message


def test_the_event_stream_is_read_as_it_comes(home: Path) -> None:
    with _serve() as (url, seen):
        client = Client(url=url, token="t")
        assert list(client.stream("/v1/events/stream", after=3, job="j-1", none=None)) == [
            {"seq": 4, "kind": "running"}, {"seq": 5, "kind": "running"}]
        asked = seen.requests[-1]
        assert asked["path"] == "/v1/events/stream?job=j-1" and asked["headers"]["Last-Event-ID"] == "3"
        with pytest.raises(NotFound, match="no job j-2"):
            list(client.stream("/v1/nothing"))
    with pytest.raises(ControlPlaneError) as err:
        list(Client(url=url, token="t").stream("/v1/events/stream"))
    assert err.value.message.startswith(f"lost the event stream of the control plane at {url} (")


class _Proxy(BaseHTTPRequestHandler):
    """An HTTP proxy: a request for a whole URL is answered by the proxy itself (saying what it was asked);
    CONNECT opens a tunnel to the address asked for."""

    protocol_version = "HTTP/1.1"
    asked: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.asked.append((self.requestline, self.headers.get("Proxy-Authorization")))
        body = json.dumps({"via": "proxy", "url": self.path, "host": self.headers["Host"]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:
        self.asked.append((self.requestline, self.headers.get("Proxy-Authorization")))
        host, _, port = self.path.rpartition(":")
        upstream = socket.create_connection((host, int(port)))
        self.send_response(200)
        self.end_headers()
        self.wfile.flush()

        def pump(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):  # the other side has gone
                while data := a.recv(65536):
                    b.sendall(data)
                b.shutdown(socket.SHUT_WR)

        threading.Thread(target=pump, args=(upstream, self.connection), daemon=True).start()
        pump(self.connection, upstream)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _proxy() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    asked: list[tuple[str, str | None]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("P", (_Proxy,), {"asked": asked}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_requests_go_through_the_proxies_of_the_environment(home: Path, auto: pki.ServerTLS,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert auto.ca is not None
    with _proxy() as (proxy, asked):
        monkeypatch.setenv("HTTP_PROXY", f"http://me:s%40cret@{proxy}")
        answer = Client(url="http://api.test:8470", token="t").get("/v1/nodes")
        assert answer == {"via": "proxy", "url": "http://api.test:8470/v1/nodes", "host": "api.test:8470"}
        assert asked[-1] == ("GET http://api.test:8470/v1/nodes HTTP/1.1", "Basic bWU6c0BjcmV0")  # me:s@cret
        # HTTPS through a tunnel, the certificate checked end to end.
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        with _serve(auto) as (url, _):
            assert Client(url=url, token="t", ca=str(auto.ca)).get("/v1/jobs/j-1") == {"id": "j-1"}
            assert asked[-1][0].startswith(f"CONNECT {url.removeprefix('https://')} HTTP/1.")
            # NO_PROXY: straight to it.
            monkeypatch.setenv("NO_PROXY", "example.com,localhost")
            before = len(asked)
            assert Client(url=url, token="t", ca=str(auto.ca)).get("/v1/jobs/j-1") == {"id": "j-1"}
            assert len(asked) == before
    monkeypatch.setenv("HTTP_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(ConfigError, match="only http:// proxies"):
        Client(url="http://api.test:8470", token="t").get("/v1/nodes")
