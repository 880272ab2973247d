"""The memory made ready for a dump: a file of the dump's size in its staging area, removed on release."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tidal.mechanisms.criu import warmup
from tidal.mechanisms.criu.warmup import Warmup


def test_holds_the_bytes_until_released(tmp_path: Path) -> None:
    w = Warmup(tmp_path, 3 * warmup.BLOCK + 5)
    (f,) = tmp_path.iterdir()
    assert f.stat().st_size == 3 * warmup.BLOCK + 5
    assert f.stat().st_blocks * 512 >= 3 * warmup.BLOCK  # written, so allocated
    assert f.stat().st_mode & 0o777 == 0o600
    w.release()
    assert list(tmp_path.iterdir()) == []
    w.release()  # twice: nothing left to do


def test_a_full_staging_area_gives_back_what_it_got(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    calls = []

    def write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    w = Warmup(tmp_path, 4 * warmup.BLOCK)
    assert list(tmp_path.iterdir()) == [] and w.path is None
    w.release()
