"""A node root's staging usage (what its agent reports in heartbeats): the bytes allocated below its areas in
memory and on disk, none for areas that do not exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.mechanisms.criu import rank
from tidal.mechanisms.criu.rank import NodeRoot

MIB = 1 << 20


def test_staging_usage_counts_the_files_of_each_area(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank, "FAST_STAGING", tmp_path / "shm")
    node = NodeRoot("n1", tmp_path / "root")
    assert node.staging_usage() == {"memory": 0, "disk": 0}
    disk = node.staging("job-a")  # no size asked: on disk
    (disk / "rank-0").mkdir()
    (disk / "rank-0" / "pages-1.img").write_bytes(b"\1" * MIB)
    fast = node._fast / "job-b"
    fast.mkdir(parents=True)
    (fast / "pages-1.img").write_bytes(b"\2" * (2 * MIB))
    (fast / "link").symlink_to("/usr")  # not followed
    fetched = node._fetched / "job-c"
    fetched.mkdir(parents=True)
    (fetched / "pages-1.img").write_bytes(b"\3" * MIB)
    (fetched / "sparse.img").write_bytes(b"")
    with (fetched / "sparse.img").open("r+b") as f:
        f.truncate(64 * MIB)  # a hole allocates nothing
    usage = node.staging_usage()
    assert 3 * MIB <= usage["memory"] < 3 * MIB + 256 * 1024, usage
    assert MIB <= usage["disk"] < MIB + 128 * 1024, usage
    node.clear_staging()
    assert node.staging_usage() == {"memory": 0, "disk": 0}
