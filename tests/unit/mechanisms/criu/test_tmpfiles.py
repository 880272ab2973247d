"""Files of the temporary directory a rank holds open or mapped (TorchInductor's compiled shared objects) are
carried by the checkpoint and put back where missing before CRIU restores (a directory of the test is the
job's TMPDIR; this test process is the rank)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from tidal.errors import CheckpointError
from tidal.mechanisms.criu.tmpfiles import TmpFile, capture, held, put_back


def test_held_files_of_the_temporary_directory_are_captured_and_put_back_where_missing(tmp_path: Path) -> None:
    tmp, work, ours = tmp_path / "tmp", tmp_path / "tmp" / "work", tmp_path / "tmp" / "tidal-node"
    cache = tmp / "torchinductor_user" / "pj"
    for d in (cache, work, ours):
        d.mkdir(parents=True)
    env = {"TMPDIR": str(tmp)}
    so = cache / "cpjaq6.main.so"
    so.write_bytes(b"\x7fELF" + b"k" * 5000)
    os.chmod(so, 0o755)
    os.utime(so, ns=(1_000_000_000, 1_000_000_000))
    with open(so, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # only the mapping holds it: as dlopen does
    opened = os.open(tmp / "scratch", os.O_CREAT | os.O_RDWR, 0o600)
    os.write(opened, b"scratch")
    (tmp / "other").write_bytes(b"held by nobody")
    in_work = os.open(work / "log.txt", os.O_CREAT | os.O_RDWR, 0o600)  # the working directory's: saved apart
    in_ours = os.open(ours / "rank.log", os.O_CREAT | os.O_RDWR, 0o600)  # Tidal's own
    gone = os.open(tmp / "gone", os.O_CREAT | os.O_RDWR, 0o600)
    os.unlink(tmp / "gone")  # no name left: CRIU copies it itself (a ghost file)
    try:
        # Only the test's own: the test runner may hold files of /tmp too (its output redirected there).
        assert sorted(p for p in held([os.getpid()], env, (work, ours)) if p.startswith(str(tmp))) == \
            [str(tmp / "scratch"), str(so)]
        captured = [TmpFile.from_json(f.to_json()) for f in capture([os.getpid()], env, (work, ours),
                                                                    tmp_path / "captured")]
        files = [(i, f) for i, f in enumerate(captured) if f.path.startswith(str(tmp))]
        assert [(f.path, f.mode, f.size, f.mtime_ns) for _, f in files][1] == (str(so), 0o755, 5004, 1_000_000_000)
        # Another machine: no cache there. The scratch file is there as it was: left alone.
        scratch_inode = os.stat(tmp / "scratch").st_ino
        os.remove(so)
        os.rmdir(cache)
        put_back([(f, tmp_path / "captured" / str(i)) for i, f in files], env)
        assert so.read_bytes() == b"\x7fELF" + b"k" * 5000
        assert (so.stat().st_mode & 0o777, so.stat().st_mtime_ns) == (0o755, 1_000_000_000)
        assert os.stat(tmp / "scratch").st_ino == scratch_inode
        assert sorted(p.name for p in cache.iterdir()) == ["cpjaq6.main.so"]
    finally:
        mapping.close()
        for fd in (opened, in_work, in_ours, gone):
            os.close(fd)


def test_a_path_outside_the_temporary_directories_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c").write_bytes(b"x")
    for path in ("/etc/passwd", f"{tmp_path}/../../etc/x", "relative"):
        with pytest.raises(CheckpointError, match="bad temporary file path"):
            put_back([(TmpFile(path, 0o644, 1, 0), tmp_path / "c")], {"TMPDIR": str(tmp_path)})
    assert not Path("relative").exists()
