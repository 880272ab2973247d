"""How a client trusts the control plane: a CA file, or a pinned fingerprint of a certificate of the chain
the server presents, against real TLS handshakes on loopback. A pin is a root of trust, not a name to look
for: a server that shows the pinned CA's certificate but holds no certificate it signed is refused."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization

from tidal.control import pki
from tidal.errors import ConfigError
from tidal.tls import PinMismatch, PinnedContext, client_context, parse_fingerprint, untrusted, untrusted_reason


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _https(certfile: Path, keyfile: Path) -> Iterator[int]:
    """An HTTPS server on a free loopback port presenting ``certfile``; its port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certfile, keyfile)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str, verify: ssl.SSLContext | bool) -> int:
    with httpx.Client(verify=verify, timeout=10) as c:
        return c.get(url).status_code


@pytest.fixture
def auto(tmp_path: Path) -> pki.ServerTLS:
    return pki.ensure_auto(tmp_path / "srv", ["localhost", "127.0.0.1"])


def test_fingerprints_are_read_in_the_forms_people_paste() -> None:
    raw = bytes(range(32))
    colons = ":".join(f"{b:02X}" for b in raw)
    for text in (colons, colons.lower(), colons.replace(":", ""), f"sha256:{colons}", f"SHA256 Fingerprint={colons}",
                 f"  {colons}\n"):
        assert parse_fingerprint(text) == raw, text
    for bad in ("", "AB:CD", colons + ":00", "zz" * 32):
        with pytest.raises(ConfigError, match="is not a SHA-256 fingerprint"):
            parse_fingerprint(bad)
    with pytest.raises(ConfigError, match="not both"):
        client_context(ca="ca.pem", pin=colons)
    assert client_context() is None


def test_the_ca_file_is_trusted_and_the_name_checked(auto: pki.ServerTLS) -> None:
    assert auto.ca is not None
    with _https(auto.certfile, auto.keyfile) as port:
        assert _get(f"https://localhost:{port}", client_context(ca=auto.ca) or True) == 200
        # Without it: the system's trust store does not know Tidal's private CA.
        with pytest.raises(httpx.ConnectError) as err:
            _get(f"https://localhost:{port}", True)
        assert untrusted(err.value) is not None
        assert "self-signed certificate in certificate chain" in str(untrusted_reason(err.value))


def test_a_pinned_ca_is_the_only_root_and_the_name_is_checked(auto: pki.ServerTLS, tmp_path: Path) -> None:
    with _https(auto.certfile, auto.keyfile) as port:
        ctx = client_context(pin=auto.fingerprint)
        assert isinstance(ctx, PinnedContext)
        assert _get(f"https://localhost:{port}", ctx) == 200
        assert ctx.anchor is not None and ctx.check_hostname  # learnt once, then OpenSSL verifies
        assert _get(f"https://127.0.0.1:{port}/again", ctx) == 200
    # A certificate of the same CA for other names only: the name is checked.
    d = tmp_path / "srv" / "tls"
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    ca = pki.x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
    key, cert = pki.issue_server(ca_key, ca, ["elsewhere.example"])  # type: ignore[arg-type]
    other = tmp_path / "other.pem"
    other.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    other_key = tmp_path / "other.key"
    other_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    with _https(other, other_key) as port, pytest.raises(httpx.ConnectError) as err:
        _get(f"https://localhost:{port}", client_context(pin=auto.fingerprint) or True)
    assert "Hostname mismatch" in str(untrusted_reason(err.value))


def test_a_server_showing_the_pinned_ca_without_its_signature_is_refused(auto: pki.ServerTLS,
                                                                         tmp_path: Path) -> None:
    # The impostor has its own CA and presents the real CA's certificate (public) after its own: the pinned
    # certificate is in the chain, but nothing the impostor holds is signed by it.
    evil = pki.ensure_auto(tmp_path / "evil", ["localhost", "127.0.0.1"])
    leaf = pki.x509.load_pem_x509_certificates(evil.certfile.read_bytes())[0]
    assert auto.ca is not None
    chain = tmp_path / "impostor.pem"
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + auto.ca.read_bytes())
    with _https(chain, evil.keyfile) as port, pytest.raises(httpx.ConnectError) as err:
        _get(f"https://localhost:{port}", client_context(pin=auto.fingerprint) or True)
    assert untrusted(err.value) is not None and "certificate verify failed" in str(err.value)


def test_a_wrong_pin_is_refused_saying_what_the_server_presented(auto: pki.ServerTLS, tmp_path: Path) -> None:
    other = pki.ensure_auto(tmp_path / "other", ["localhost"])
    with _https(auto.certfile, auto.keyfile) as port, pytest.raises(httpx.ConnectError) as err:
        _get(f"https://localhost:{port}", client_context(pin=other.fingerprint) or True)
    assert isinstance(untrusted(err.value), PinMismatch)
    reason = str(untrusted_reason(err.value))
    assert reason.startswith(f"the server presented no certificate with the pinned SHA-256 fingerprint "
                             f"{other.fingerprint}") and auto.fingerprint in reason


def test_the_server_certificate_itself_may_be_pinned(auto: pki.ServerTLS) -> None:
    leaf = pki.x509.load_pem_x509_certificates(auto.certfile.read_bytes())[0]
    pin = pki.cert_fingerprint(leaf)
    with _https(auto.certfile, auto.keyfile) as port:
        ctx = client_context(pin=pin)
        # The pinned certificate names the server itself: any address of it will do.
        assert _get(f"https://127.0.0.1:{port}", ctx or True) == 200
        assert isinstance(ctx, PinnedContext) and not ctx.check_hostname
