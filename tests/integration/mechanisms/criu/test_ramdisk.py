"""Tidal's staging tmpfs: mounted with large pages where it can be, never over something in use."""

from __future__ import annotations

import os
from pathlib import Path

from tidal.mechanisms.checks import check_staging
from tidal.mechanisms.criu import ramdisk
from tidal.mechanisms.criu.rank import FAST_STAGING, NodeRoot


def test_the_staging_root_is_mounted_with_large_pages(tmp_path: Path) -> None:
    root = ramdisk.fast_root(tmp_path)
    try:
        assert root == tmp_path / "tidal"
        opts = ramdisk.mount_options(root)
        assert opts is not None and opts.startswith("tmpfs:")
        assert "huge=within_size" in opts.split(":", 1)[1].split(",")
        assert oct(os.stat(root).st_mode & 0o777) == "0o700"
        assert ramdisk.fast_root(tmp_path) == root and ramdisk.mount_options(root) == opts  # mounted once
        seen = check_staging(tmp_path, euid=0)
        assert (seen.status, seen.detail) == ("ok", f"{root}: tmpfs with large pages")
    finally:
        ramdisk.unmount(root)
    assert ramdisk.mount_options(root) is None


def test_no_mount_over_a_directory_in_use(tmp_path: Path) -> None:
    (tmp_path / "tidal" / "node-1-abc").mkdir(parents=True)
    (tmp_path / "tidal" / "node-1-abc" / "pages-1.img").write_bytes(b"in use")
    root = ramdisk.fast_root(tmp_path)
    assert ramdisk.mount_options(root) is None
    assert (root / "node-1-abc" / "pages-1.img").read_bytes() == b"in use"


def test_an_empty_trash_does_not_stop_the_mount(tmp_path: Path) -> None:
    (tmp_path / "tidal" / ".discarded").mkdir(parents=True)
    root = ramdisk.fast_root(tmp_path)
    try:
        assert ramdisk.mount_options(root) is not None
    finally:
        ramdisk.unmount(root)


def test_node_stages_images_in_the_large_page_tmpfs(tmp_path: Path) -> None:
    node = NodeRoot("node-ramdisk", tmp_path / "node")
    try:
        d = node.staging("job-1", need_bytes=1 << 20)
        assert d.is_relative_to(FAST_STAGING / "tidal")
        opts = ramdisk.mount_options(FAST_STAGING / "tidal")
        assert opts is not None and "huge=within_size" in opts
        small = node.staging("job-2")  # no size given: the node root's own disk
        assert small.is_relative_to(tmp_path / "node" / "staging")
    finally:
        node.clear_staging()
