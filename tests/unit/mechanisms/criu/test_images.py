"""Chunk boundaries of CRIU page files follow virtual-address windows."""

from __future__ import annotations

from pathlib import Path

from tests.unit.mechanisms.criu.pagemaps import MAGIC, entry
from tidal.mechanisms.criu.images import PAGE, PE_PRESENT, page_file_boundaries


def _pagemap(path: Path, pages_id: int, entries: list[tuple[int, int, int]]) -> None:
    data = MAGIC + entry({1: pages_id})
    for vaddr, nr, flags in entries:
        data += entry({1: vaddr, 2: nr, 4: flags})
    path.write_bytes(data)


def test_boundaries_at_window_starts(tmp_path: Path) -> None:
    mib = 1 << 20
    _pagemap(tmp_path / "pagemap-1.img", 7, [
        (0x400000, 2, PE_PRESENT),                    # window 4: file offsets 0..8K
        (0x500000 - PAGE, 3, PE_PRESENT),             # one more page of window 4, then window 5
        (0x900000, 1, 0),                             # not present: no bytes in the file
        (0x900000 + PAGE, 1, PE_PRESENT),             # window 9
    ])
    got = page_file_boundaries(tmp_path, window=mib)
    assert got == {"pages-7.img": [3 * PAGE, 5 * PAGE]}


def test_garbage_pagemap_gives_no_boundaries(tmp_path: Path) -> None:
    (tmp_path / "pagemap-1.img").write_bytes(b"\x00" * 3)
    assert page_file_boundaries(tmp_path) == {}
