"""Files of /dev/shm a rank holds by name are carried by the checkpoint and put back before CRIU restores
(a directory of the test stands in for /dev/shm; this test process is the rank)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from tidal.errors import CheckpointError
from tidal.mechanisms.criu.shmfiles import ShmFile, capture, held, put_back


def test_files_held_open_or_mapped_by_name_are_captured_and_put_back(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    opened = os.open(shm / "torch_7_123_34", os.O_CREAT | os.O_RDWR, 0o640)
    os.ftruncate(opened, 8192)
    os.pwrite(opened, b"batch", 4096)
    (shm / "mapped").write_bytes(b"m" * 4096)
    with open(shm / "mapped", "r+b") as f:
        mapping = mmap.mmap(f.fileno(), 4096)  # the descriptor is closed below: only the mapping holds it
    (shm / "other").write_bytes(b"held by nobody")
    gone = os.open(shm / "gone", os.O_CREAT | os.O_RDWR, 0o600)
    os.unlink(shm / "gone")  # no name left: CRIU copies it itself (a ghost file)
    replaced = os.open(shm / "replaced", os.O_CREAT | os.O_RDWR, 0o600)
    os.unlink(shm / "replaced")
    (shm / "replaced").write_bytes(b"a new file under the old name")
    try:
        assert sorted(held([os.getpid()], shm)) == ["mapped", "torch_7_123_34"]
        files = capture([os.getpid()], tmp_path / "captured", shm)
        files = [ShmFile.from_json(f.to_json()) for f in files]
        assert [(f.name, f.mode, f.size) for f in files] == [("mapped", 0o666 & ~_umask(), 4096),
                                                              ("torch_7_123_34", 0o640 & ~_umask(), 8192)]
        # The rank goes on: it removes one name (torch does at once), and reuses the other for a new file.
        os.unlink(shm / "torch_7_123_34")
        (shm / "mapped").unlink()
        (shm / "mapped").write_bytes(b"someone else's")
        put_back([(f, tmp_path / "captured" / f.name) for f in files], shm=shm)
        back = (shm / "torch_7_123_34").read_bytes()
        assert len(back) == 8192 and back[4096:4101] == b"batch" and back[:4096] == bytes(4096)
        assert (shm / "torch_7_123_34").stat().st_mode & 0o777 == 0o640 & ~_umask()
        assert (shm / "mapped").read_bytes() == b"m" * 4096
        assert sorted(p.name for p in shm.iterdir()) == ["mapped", "other", "replaced", "torch_7_123_34"]
    finally:
        mapping.close()
        for fd in (opened, gone, replaced):
            os.close(fd)


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_a_bad_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    src = tmp_path / "content"
    src.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="bad shared-memory file name"):
        put_back([(ShmFile("../escape", 0o600, 1), src)], shm=shm)
    assert not (tmp_path / "escape").exists() and not list(shm.iterdir())
