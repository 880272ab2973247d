"""CRIU lookup order, offline re-install from the cached packages, and clear errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tidal.errors import ProvisionError
from tidal.mechanisms.criu import provision


@pytest.fixture(autouse=True)
def _fresh_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDAL_CRIU", raising=False)
    provision._find_cached.cache_clear()
    yield
    provision._find_cached.cache_clear()


def _fake_criu(bindir: Path, version: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "criu"
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 'Version: {version}' && exit 0\necho 'Looks good.'\n")
    exe.chmod(0o755)
    return exe


def test_tidal_criu_wins_and_a_broken_one_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wrapper = provision.default_prefix() / "bin" / "criu"
    monkeypatch.setenv("TIDAL_CRIU", str(wrapper))
    found = provision.find_criu()
    assert found.source == "TIDAL_CRIU" and found.version >= (4, 0)
    provision._find_cached.cache_clear()
    monkeypatch.setenv("TIDAL_CRIU", str(tmp_path / "nope"))
    with pytest.raises(ProvisionError, match="TIDAL_CRIU=.*nope is not a working CRIU") as err:
        provision.find_criu()
    assert "unset TIDAL_CRIU" in (err.value.hint or "")


def test_old_system_criu_is_skipped_for_the_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_criu(tmp_path / "bin", "3.17")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    found = provision.find_criu()
    assert found.source == "prefix"


def test_new_system_criu_is_preferred(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = _fake_criu(tmp_path / "bin", "4.2")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    found = provision.find_criu()
    assert (found.source, found.argv, found.version) == ("system", (str(exe),), (4, 2))


def test_nothing_found_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no criu anywhere
    with pytest.raises(ProvisionError, match="no working CRIU") as err:
        provision.find_criu(tmp_path / "empty-prefix")
    assert "make criu" in (err.value.hint or "")


def test_reinstall_from_cached_packages_is_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    prefix = tmp_path / "criu"
    shutil.copytree(provision.default_prefix() / "debs", prefix / "debs")
    # No apt-get on PATH: any download attempt would fail.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("dpkg", "dpkg-deb", "tar", "sh", "rm", "xz", "zstd"):
        path = shutil.which(tool)
        if path:
            (bindir / tool).symlink_to(path)
    monkeypatch.setenv("PATH", str(bindir))
    found = provision.install_prefix(prefix, log=False)
    assert found.source == "prefix" and found.version >= (4, 0)
    assert (prefix / "bin" / "criu").exists()
    again = provision.ensure_criu(prefix, log=False)  # idempotent: finds it, installs nothing
    assert again.argv == found.argv
