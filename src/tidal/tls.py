"""How a client of the control plane (the CLI, a node's agent) trusts its certificate: a CA file, or a
pinned SHA-256 fingerprint.

- A **CA file** (``TIDAL_CA``, ``tidal agent --ca``) is the only trust root; the server's name is checked.
- A **pinned fingerprint** (``TIDAL_CA_FINGERPRINT``, ``tidal agent --ca-fingerprint``) is the SHA-256 of
  one certificate of the chain the server presents: its CA's (``tidal server --tls auto`` prints it), or the
  server certificate's own. :class:`PinnedContext` learns that certificate from the server on its first
  connection (it must be in the chain presented), checks its fingerprint, and from then on verifies every
  connection with that one certificate as its only trust root (OpenSSL checks the chain and the
  signatures; an intermediate or the server's own certificate may be the root of trust). When the pin is
  a CA's, the server's name is checked too; a pinned server certificate names the server itself.

:func:`untrusted` tells a connection refused for the server's certificate from a network failure.

Used by all layers that talk to the control plane; it imports nothing of Tidal but its errors.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

from tidal.errors import ConfigError, TidalError

_HEX = re.compile(r"^[0-9a-f]{64}$")


class PinMismatch(TidalError, ssl.SSLCertVerificationError):
    """The server presented no certificate with the pinned fingerprint. An ``ssl.SSLCertVerificationError``
    too: raised from inside a TLS connection, it fails it as any other certificate refusal would."""


def fingerprint(der: bytes) -> str:
    """The SHA-256 fingerprint of a DER certificate as ``openssl x509 -fingerprint -sha256`` shows it
    (upper-case hex pairs joined by ``:``)."""
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def parse_fingerprint(text: str) -> bytes:
    """A SHA-256 fingerprint as given: hex, with or without ``:`` (or spaces), any case, and an optional
    ``sha256:`` / ``SHA256 Fingerprint=`` in front. The 32 bytes, or a ConfigError."""
    t = text.strip()
    for prefix in ("sha256 fingerprint=", "sha256:", "sha256="):
        if t.lower().startswith(prefix):
            t = t[len(prefix):]
    h = re.sub(r"[:\s]", "", t).lower()
    if not _HEX.match(h):
        raise ConfigError(f"{text!r} is not a SHA-256 fingerprint", field="fingerprint",
                          hint="64 hex digits, with or without ':' between pairs, as `tidal server` prints it "
                               "(or `openssl x509 -noout -fingerprint -sha256 -in ca.pem`)")
    return bytes.fromhex(h)


def client_context(ca: str | Path | None = None, pin: str | None = None) -> ssl.SSLContext | None:
    """The SSL context a client verifies the control plane with: trusting only ``ca`` (a PEM file), or only
    the certificate whose SHA-256 fingerprint is ``pin``; None for neither (the system's trust store)."""
    if ca and pin:
        raise ConfigError("give the control plane's CA file or a pinned fingerprint, not both",
                          hint="unset TIDAL_CA or TIDAL_CA_FINGERPRINT (--ca or --ca-fingerprint)")
    if ca:
        path = Path(ca)
        try:
            return ssl.create_default_context(cafile=str(path))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot read the CA certificate {path}: {exc}", field="ca",
                              hint="give a PEM file (`tidal server --tls auto` writes TIDAL_HOME/tls/ca.pem)") from None
    if pin:
        return PinnedContext(parse_fingerprint(pin))
    return None


def presented_chain(sock: ssl.SSLSocket) -> list[bytes]:
    """The certificates the peer presented, leaf first, as DER (not verified)."""
    public = getattr(sock, "get_unverified_chain", None)  # Python 3.13 on
    if public is not None:
        return [bytes(c) for c in public() or []]
    private = getattr(getattr(sock, "_sslobj", None), "get_unverified_chain", None)  # 3.10 to 3.12
    if private is not None:
        import _ssl

        return [c.public_bytes(_ssl.ENCODING_DER) for c in private() or []]
    leaf = sock.getpeercert(binary_form=True)
    return [leaf] if leaf else []


class PinnedContext(ssl.SSLContext):
    """A client SSL context that trusts exactly one certificate: the one with the pinned SHA-256 fingerprint.

    On its first connection it asks the server which certificates it presents (a handshake that verifies
    nothing and after which nothing is sent), and takes the one with the pinned fingerprint as its only
    trust root. Every connection is then verified by OpenSSL against that root (chain and signatures, and the
    server's name when the root is not the server's own certificate). A server that does not present the
    pinned certificate is refused (:class:`ssl.SSLCertVerificationError`, saying what it presented)."""

    pin: bytes
    anchor: bytes | None

    def __new__(cls, pin: bytes, *args: Any, **kw: Any) -> PinnedContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self, pin: bytes) -> None:
        # (ssl.SSLContext is made whole by __new__: it has no __init__ of its own to call.)
        if len(pin) != 32:
            raise ConfigError("a pinned fingerprint is 32 bytes of SHA-256", field="fingerprint")
        self.pin = pin
        self.anchor = None
        self._learning = threading.Lock()
        self.verify_mode = ssl.CERT_REQUIRED
        # The root of trust may be an intermediate or the server's own certificate, not only a self-signed CA.
        self.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN

    def wrap_socket(self, sock: socket.socket, *args: Any, **kw: Any) -> ssl.SSLSocket:
        with self._learning:
            if self.anchor is None:
                # The first connection only shows which certificates the server presents; the verified
                # connection is a second one to the same address (one after the other: a server that
                # handshakes connections one at a time is never kept waiting for the other).
                peer, timeout = sock.getpeername(), sock.gettimeout()
                self._learn(sock, kw.get("server_hostname"))
                sock = socket.create_connection(peer[:2], timeout=timeout)
        return super().wrap_socket(sock, *args, **kw)

    def _learn(self, sock: socket.socket, server_hostname: str | None) -> None:
        """Take the pinned certificate of the chain the server presents on ``sock`` (then closed) as the
        only root of trust."""
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        probe.check_hostname = False
        probe.verify_mode = ssl.CERT_NONE
        with probe.wrap_socket(sock, server_hostname=server_hostname) as tls:
            chain = presented_chain(tls)
        for i, der in enumerate(chain):
            if hashlib.sha256(der).digest() == self.pin:
                self.load_verify_locations(cadata=der)
                # The server's own certificate pinned: it names the server; a CA pinned: check the name too.
                self.check_hostname = i > 0
                self.anchor = der
                return
        shown = ", ".join(fingerprint(d) for d in chain) or "none"
        raise PinMismatch(f"the server presented no certificate with the pinned SHA-256 fingerprint "
                          f"{fingerprint_of_pin(self.pin)} (it presented: {shown})")


def fingerprint_of_pin(pin: bytes) -> str:
    return ":".join(f"{b:02X}" for b in pin)


def untrusted(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind a failed request (httpx wraps it twice), if that is
    why it failed."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, ssl.SSLCertVerificationError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def untrusted_reason(exc: BaseException) -> str | None:
    """Why the server's certificate was refused, in words (OpenSSL's reason, or the pin's), or None."""
    err = untrusted(exc)
    if err is None:
        return None
    if isinstance(err, PinMismatch):
        return err.message
    return str(getattr(err, "verify_message", None) or err)
