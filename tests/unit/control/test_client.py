"""The control plane's client: where it finds the API and its token, and the API's errors as TidalErrors."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import httpx
import pytest

from tidal.control.client import Client, ControlPlaneError, UntrustedServer, endpoint, error_for, trust, user_token
from tidal.control.clusterfile import ClusterState, Proc, state_path, token_path
from tidal.errors import ConfigError, Conflict, NotFound, TidalError, Unauthorized, ValidationError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TIDAL_URL", "TIDAL_TOKEN", "TIDAL_CA", "TIDAL_CA_FINGERPRINT"):
        monkeypatch.delenv(var, raising=False)
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


def _client(handler: httpx.MockTransport) -> Client:
    client = Client(url="http://api.test", token="tdl_x")
    client.http = httpx.Client(base_url=client.url, transport=handler, headers=client.http.headers)
    return client


def test_requests_carry_the_token_and_errors_raise(home: Path) -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/jobs/j-1":
            return httpx.Response(200, json={"id": "j-1"})
        if request.url.path == "/v1/boom":
            return httpx.Response(502, text="<html>bad gateway</html>")
        return httpx.Response(404, json={"error": "NotFound", "message": "no job j-2", "hint": "tidal ls"})

    client = _client(httpx.MockTransport(handle))
    assert client.get("/v1/jobs/j-1") == {"id": "j-1"}
    assert seen[0].headers["authorization"] == "Bearer tdl_x"
    with pytest.raises(NotFound, match="no job j-2"):
        client.get("/v1/jobs/j-2")
    with pytest.raises(ControlPlaneError, match="bad gateway"):
        client.post("/v1/boom", json={})


def test_an_unreachable_control_plane_says_what_to_check(home: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ControlPlaneError) as err:
        _client(httpx.MockTransport(refuse)).get("/v1/nodes")
    assert "cannot reach the control plane at http://api.test" in err.value.message
    assert err.value.hint and "tidal status" in err.value.hint


def test_admin_commands_take_the_admin_token_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_path(home, "admin").parent.mkdir()
    token_path(home, "admin").write_text("tdl_admin\n")
    assert user_token(home, "admin") == "tdl_admin"
    monkeypatch.setenv("TIDAL_TOKEN", "tdl_env")
    assert user_token(home, "admin") == "tdl_env"


def test_the_certificate_is_trusted_by_tidal_ca_or_tidal_ca_fingerprint(home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert trust() is True  # the system's trust store
    monkeypatch.setenv("TIDAL_CA_FINGERPRINT", "AB" * 32)
    assert isinstance(trust(), ssl.SSLContext)
    monkeypatch.setenv("TIDAL_CA", str(home / "missing.pem"))
    with pytest.raises(ConfigError, match="not both"):
        trust()
    monkeypatch.delenv("TIDAL_CA_FINGERPRINT")
    with pytest.raises(ConfigError, match="cannot read the CA certificate"):
        trust()


def test_an_untrusted_server_is_refused_saying_what_to_set(home: Path) -> None:
    def untrusted(request: httpx.Request) -> httpx.Response:
        cause = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
        cause.verify_message = "self-signed certificate in certificate chain"
        raise httpx.ConnectError("certificate verify failed", request=request) from cause

    with pytest.raises(UntrustedServer) as err:
        _client(httpx.MockTransport(untrusted)).get("/v1/nodes")
    assert err.value.message == ("refusing to talk to the control plane at http://api.test: its certificate is not "
                                 "trusted (self-signed certificate in certificate chain)")
    assert err.value.hint and "TIDAL_CA=FILE" in err.value.hint and "TIDAL_CA_FINGERPRINT" in err.value.hint
