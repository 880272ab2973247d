"""The control-plane process's settings: where it listens, whether it serves TLS, and what `tidal server`
prints at start."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tidal.control import pki
from tidal.control.regionstores import RegionStores
from tidal.control.server import MIN_LEASE_S, banner, check_lease, listen_address, public_host, public_url, tls_of
from tidal.errors import ConfigError


def _args(**kw: object) -> argparse.Namespace:
    base = {"listen": None, "host": None, "port": None, "tls": None, "tls_cert": None, "tls_key": None,
            "tls_san": []}
    return argparse.Namespace(**{**base, **kw})


def test_listen_address() -> None:
    assert listen_address(_args()) == ("127.0.0.1", 8470)  # `tidal up`'s: loopback
    assert listen_address(_args(port=9000)) == ("127.0.0.1", 9000)
    assert listen_address(_args(listen="0.0.0.0:8471")) == ("0.0.0.0", 8471)
    assert listen_address(_args(listen="[::]:8472")) == ("::", 8472)
    for bad in ("0.0.0.0", "host:", "host:http", "host:70000"):
        with pytest.raises(ConfigError, match="give ADDR:PORT"):
            listen_address(_args(listen=bad))


def test_a_lease_leaves_room_for_agents_to_fence_themselves() -> None:
    check_lease(MIN_LEASE_S)
    check_lease(30.0)
    for bad in (1.9, 0.0, -5.0, float("nan")):
        with pytest.raises(ConfigError, match="an agent's lease lasts at least 2s") as err:
            check_lease(bad)
        assert err.value.hint and "fence themselves" in err.value.hint


def test_plain_http_is_for_loopback_or_asked_for(tmp_path: Path) -> None:
    assert tls_of(_args(), tmp_path, "127.0.0.1") is None
    with pytest.raises(ConfigError, match="without TLS: tokens would cross the network in clear") as err:
        tls_of(_args(), tmp_path, "0.0.0.0")
    assert err.value.hint and "--tls auto" in err.value.hint
    assert tls_of(_args(tls="off"), tmp_path, "0.0.0.0") is None
    with pytest.raises(ConfigError, match="both --tls-cert and --tls-key"):
        tls_of(_args(tls_cert="c.pem"), tmp_path, "0.0.0.0")
    auto = tls_of(_args(tls="auto", tls_san=["tidal.example"]), tmp_path, "0.0.0.0")
    assert auto is not None and auto.ca == tmp_path / "tls" / "ca.pem" and "tidal.example" in auto.names


def test_the_banner_says_what_to_trust_and_how_a_node_joins(tmp_path: Path) -> None:
    tls = pki.ensure_auto(tmp_path, ["tidal.example"])
    url = public_url("0.0.0.0", 8470, tls, ["tidal.example"])
    assert url == "https://tidal.example:8470"
    text = banner(url, tmp_path, tls, "postgresql+psycopg://tidal:s3cret@db/tidal",
                  RegionStores("s3://b/p", {"east": "s3://e/p"}), 10)
    assert "s3cret" not in text and "postgresql+psycopg://tidal:***@db/tidal" in text
    assert "checkpoint store: east: s3://e/p; other regions: s3://b/p" in text
    assert f"CA fingerprint (SHA-256): {tls.fingerprint}" in text
    assert f"tidal agent --server {url} --ca-fingerprint {tls.fingerprint} --join-token TOKEN --name NODE" in text
    assert f"export TIDAL_CA={tls.ca}" in text and "tidal token create --node NODE" in text
    assert public_url("::1", 8470, None, []) == "http://[::1]:8470"
    assert public_url("0.0.0.0", 8470, tls, ["tidal.example"], "10.0.0.5") == "https://10.0.0.5:8470"


def test_the_address_nodes_reach_the_control_plane_at() -> None:
    assert public_host("127.0.0.1", []) == "127.0.0.1"  # `tidal up`: the rendezvous store on loopback, as before
    assert public_host("10.0.0.5", []) == "10.0.0.5"
    assert public_host("0.0.0.0", ["tidal.example", "10.0.0.5"]) == "tidal.example"
    assert public_host("0.0.0.0", ["tidal.example"], "10.0.0.6") == "10.0.0.6"
