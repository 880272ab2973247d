"""`tidal server --tls auto`'s certificates: a private CA made once and kept, a server certificate for the
names clients use, made again when a name is missing or it is about to expire; keys owner-only. And the
operator's own certificate, checked."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import socket
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tidal.control import pki
from tidal.errors import ConfigError


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _chain(p: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(p.read_bytes())


def test_auto_makes_a_ca_and_a_server_certificate_owner_only(tmp_path: Path) -> None:
    tls = pki.ensure_auto(tmp_path, pki.names_for("0.0.0.0", ["tidal.example", "10.0.0.5"]))
    d = tmp_path / "tls"
    assert _mode(d) == 0o700 and _mode(d / "ca.key") == 0o600 and _mode(d / "server.key") == 0o600
    assert tls.ca == d / "ca.pem" and tls.certfile == d / "server.pem" and tls.keyfile == d / "server.key"
    ca = _chain(d / "ca.pem")[0]
    # The fingerprint printed is what `openssl x509 -fingerprint -sha256` shows of ca.pem.
    der = ca.public_bytes(serialization.Encoding.DER)
    assert tls.fingerprint == ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf, top = _chain(tls.certfile)  # the server's certificate, then the CA's: pinning finds the CA in the chain
    assert top == ca
    leaf.verify_directly_issued_by(ca)
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert set(tls.names) == {"tidal.example", "10.0.0.5", "localhost", "127.0.0.1", "::1"}


def test_the_ca_is_kept_and_the_server_certificate_follows_the_names(tmp_path: Path) -> None:
    first = pki.ensure_auto(tmp_path, ["a.example"])
    leaf = _chain(first.certfile)[0]
    same = pki.ensure_auto(tmp_path, ["a.example"])
    assert same == first and _chain(same.certfile)[0] == leaf  # nothing made again
    more = pki.ensure_auto(tmp_path, ["a.example", "b.example"])
    assert more.fingerprint == first.fingerprint  # the CA stays: clients' pins keep working
    assert _chain(more.certfile)[0] != leaf and "b.example" in more.names


def test_a_server_certificate_about_to_expire_is_made_again(tmp_path: Path) -> None:
    first = pki.ensure_auto(tmp_path, ["a.example"])
    d = tmp_path / "tls"
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    ca = _chain(d / "ca.pem")[0]
    _key, soon = pki.issue_server(ca_key, ca, ["a.example"], days=10)  # type: ignore[arg-type]
    (d / "server.pem").write_bytes(soon.public_bytes(serialization.Encoding.PEM) +
                                   ca.public_bytes(serialization.Encoding.PEM))
    again = pki.ensure_auto(tmp_path, ["a.example"])
    assert again.fingerprint == first.fingerprint
    renewed = _chain(again.certfile)[0]
    assert renewed != soon
    assert renewed.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=pki.RENEW_DAYS)


def test_names_are_the_sans_the_listen_address_and_loopback() -> None:
    assert pki.names_for("10.0.0.5", ["tidal.example"]) == ["tidal.example", "10.0.0.5", *pki.LOOPBACK]
    wild = pki.names_for("0.0.0.0", [])  # no name given: the host's own names
    assert socket.gethostname() in wild and set(pki.LOOPBACK) <= set(wild) and len(set(wild)) == len(wild)
    assert pki.names_for("::", ["[fd00::5]"])[0] == "fd00::5"


def test_own_certificate_is_checked(tmp_path: Path) -> None:
    a = pki.ensure_auto(tmp_path / "a", ["a.example"])
    b = pki.ensure_auto(tmp_path / "b", ["b.example"])
    mine = pki.own(a.certfile, a.keyfile)
    assert mine.fingerprint == a.fingerprint  # the top of the chain: the CA
    with pytest.raises(ConfigError, match="is not the key of the certificate"):
        pki.own(a.certfile, b.keyfile)
    os.chmod(a.keyfile, 0o644)
    with pytest.raises(ConfigError, match="may be read by others") as err:
        pki.own(a.certfile, a.keyfile)
    assert err.value.hint == f"chmod 600 {a.keyfile}"
    with pytest.raises(ConfigError, match="cannot load"):
        pki.own(tmp_path / "missing.pem", a.keyfile)
