"""The control plane's TLS certificates.

``tidal server --tls auto``: a private CA and a server certificate it signs, under ``TIDAL_HOME/tls``
(the directory and the keys owner-only). The CA is made once and kept (10 years): clients trust it by its
file (``ca.pem``) or its SHA-256 fingerprint, so it must not change. The server certificate names the
addresses and host names clients use (its SANs) and is made again at start when a name is missing, when
it has less than 60 days left, or when it is not the CA's; ``server.pem`` holds it followed by the CA
certificate, so that clients that pin the CA's fingerprint find it in the chain.

``tidal server --tls-cert FILE --tls-key FILE``: the operator's own certificate, checked to load and to
match its key; clients then trust the operator's CA (``TIDAL_CA``) or pin a certificate of its chain.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tidal.errors import ConfigError
from tidal.mechanisms.permissions import write_private
from tidal.tls import fingerprint

CA_DAYS = 3650
SERVER_DAYS = 730
RENEW_DAYS = 60
WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
LOOPBACK = ("localhost", "127.0.0.1", "::1")

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class ServerTLS:
    """What uvicorn serves (``certfile``: the certificate chain, ``keyfile``) and what clients trust: the
    CA's file where Tidal made it, and the fingerprint to pin (the CA's, else the server certificate's)."""

    certfile: Path
    keyfile: Path
    ca: Path | None
    fingerprint: str
    names: tuple[str, ...]


def tls_dir(home: Path) -> Path:
    return home / "tls"


def names_for(listen_host: str, sans: Iterable[str]) -> list[str]:
    """The names a server certificate holds: the ``--tls-san`` names, the listen address unless it is a
    wildcard (else this machine's host names), and loopback (for clients on the server's own machine)."""
    out: list[str] = []
    for n in [*sans, *([] if listen_host in WILDCARDS else [listen_host])]:
        n = n.strip().strip("[]")
        if n and n not in out:
            out.append(n)
    if not out:
        for n in (socket.getfqdn(), socket.gethostname()):
            if n and n not in out:
                out.append(n)
    out += [n for n in LOOPBACK if n not in out]
    return out


def _general_names(names: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _cert_names(cert: x509.Certificate) -> set[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {*ext.get_values_for_type(x509.DNSName), *(str(a) for a in ext.get_values_for_type(x509.IPAddress))}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_ca(common_name: str, days: int = CA_DAYS) -> tuple[PrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tidal"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5)).not_valid_after(_now() + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def issue_server(ca_key: PrivateKey, ca_cert: x509.Certificate, names: Sequence[str],
                 days: int = SERVER_DAYS) -> tuple[PrivateKey, x509.Certificate]:
    """A server certificate for ``names`` (host names and IP addresses), signed by the CA."""
    if not names:
        raise ConfigError("a server certificate needs at least one name", field="tls_san")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tidal"),
                         x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])])
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(minutes=5))
            .not_valid_after(min(_now() + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName(_general_names(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def cert_fingerprint(cert: x509.Certificate) -> str:
    return fingerprint(cert.public_bytes(serialization.Encoding.DER))


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def ensure_auto(home: Path, names: Sequence[str]) -> ServerTLS:
    """The CA and server certificate of ``--tls auto`` under ``home/tls``: made where missing, the server
    certificate made again where it lacks one of ``names``, expires within RENEW_DAYS or is not the CA's."""
    d = tls_dir(home)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    if d.stat().st_mode & 0o077:
        d.chmod(0o700)
    ca_pem, ca_key_pem = d / "ca.pem", d / "ca.key"
    srv_pem, srv_key_pem = d / "server.pem", d / "server.key"
    if ca_pem.exists() and ca_key_pem.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_pem.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{ca_key_pem} is not the EC key Tidal made", hint=f"remove {d} to make a new CA "
                              "(clients then need the new CA file or fingerprint)")
        ca_key = loaded
        for p in (ca_key_pem, srv_key_pem):  # keys an older version, or a copy, left readable
            if p.exists() and p.stat().st_mode & 0o077:
                p.chmod(0o600)
    else:
        ca_key, ca_cert = new_ca(f"Tidal CA {socket.gethostname()}"[:64])
        write_private(ca_key_pem, _key_pem(ca_key))
        write_private(ca_pem, _cert_pem(ca_cert))
        ca_pem.chmod(0o644)  # public: clients are given it
        srv_pem.unlink(missing_ok=True)
    current = None
    if srv_pem.exists() and srv_key_pem.exists():
        current = x509.load_pem_x509_certificates(srv_pem.read_bytes())[0]
        fresh = current.not_valid_after_utc - _now() > dt.timedelta(days=RENEW_DAYS)
        if not (fresh and set(names) <= _cert_names(current) and _signed_by(current, ca_cert)):
            current = None
    if current is None:
        key, current = issue_server(ca_key, ca_cert, names)
        write_private(srv_key_pem, _key_pem(key))
        write_private(srv_pem, _cert_pem(current, ca_cert))
    return ServerTLS(srv_pem, srv_key_pem, ca_pem, cert_fingerprint(ca_cert), tuple(sorted(_cert_names(current))))


def own(certfile: str | Path, keyfile: str | Path) -> ServerTLS:
    """The operator's certificate (a PEM chain, server certificate first) and key, checked: they load, the
    key is the certificate's, and the key file is not readable by others."""
    cert_path, key_path = Path(certfile), Path(keyfile)
    try:
        chain = x509.load_pem_x509_certificates(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the TLS certificate {cert_path} and key {key_path}: {exc}",
                          hint="give a PEM certificate (chain) and its unencrypted PEM key") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if chain[0].public_key().public_bytes(serialization.Encoding.DER, pub) != \
            key.public_key().public_bytes(serialization.Encoding.DER, pub):
        raise ConfigError(f"the key {key_path} is not the key of the certificate {cert_path}",
                          hint="give the certificate's own key with --tls-key")
    if key_path.stat().st_mode & 0o077:
        raise ConfigError(f"the TLS key {key_path} may be read by others", hint=f"chmod 600 {key_path}")
    # Clients pin the top of the chain presented (the CA's where the file holds it), else the server's own.
    return ServerTLS(cert_path, key_path, None, cert_fingerprint(chain[-1]), tuple(sorted(_cert_names(chain[0]))))
