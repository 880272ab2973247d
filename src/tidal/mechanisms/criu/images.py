"""Just enough of CRIU's image format to chunk page files well.

A ``pages-N.img`` holds the present pages of one process in address order; its ``pagemap`` image says
which virtual addresses they belong to. Cutting chunks at fixed virtual-address windows (instead of
fixed file offsets) means that a region that grows or shrinks changes only its own chunks, so a second
checkpoint stores only what really changed.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

PAGE = 4096
PE_PRESENT = 1 << 2
HEADER = 8  # two magic numbers
WINDOW = 1 << 20  # chunks follow virtual-address windows of this size
PAGEMAP = re.compile(r"pagemap-\d+\.img")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(msg: bytes) -> dict[int, int]:
    """Varint fields of a protobuf message (all that pagemap entries use)."""
    out: dict[int, int] = {}
    pos = 0
    while pos < len(msg):
        key, pos = _varint(msg, pos)
        if key & 7 != 0:  # not a varint: pagemap entries have none, stop rather than guess
            break
        out[key >> 3], pos = _varint(msg, pos)
    return out


def read_entries(data: bytes, pos: int = HEADER) -> tuple[list[dict[int, int]], int]:
    """The complete entries of pagemap image bytes ``data`` from offset ``pos``, and the offset after them
    (an entry still being written is left for later)."""
    out = []
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + size > len(data):
            break
        out.append(_fields(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return out, pos


class PageWindows:
    """Where each ``window``-aligned virtual-address window starts in one page file, from its pagemap
    entries fed in order (the first is the head, naming the page file)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.pages_id: int | None = None
        self.starts: dict[int, int] = {}  # window index -> file offset, in file order
        self._offset = 0

    def add(self, entry: dict[int, int]) -> None:
        if self.pages_id is None:
            self.pages_id = entry.get(1, 0)
            return
        if not entry.get(4, 0) & PE_PRESENT:
            return
        vaddr, nr = entry.get(1, 0), entry.get(2, 0)
        first, last = vaddr // self.window, (vaddr + nr * PAGE - 1) // self.window
        for w in range(first, last + 1):
            if w not in self.starts:
                self.starts[w] = self._offset + (max(vaddr, w * self.window) - vaddr)
        self._offset += nr * PAGE


def page_file_windows(images: Path, window: int = WINDOW) -> dict[str, dict[int, int]]:
    """For every ``pages-N.img`` in ``images``: the file offset at which each ``window``-aligned virtual
    address window starts (window index → offset). Unreadable pagemaps give nothing."""
    result: dict[str, dict[int, int]] = {}
    for pagemap in images.glob("pagemap-*.img"):
        if not PAGEMAP.fullmatch(pagemap.name):
            continue
        try:
            entries, _ = read_entries(pagemap.read_bytes())
            pw = PageWindows(window)
            for entry in entries:
                pw.add(entry)
        except (OSError, IndexError, struct.error):
            continue
        if pw.pages_id is not None:
            result[f"pages-{pw.pages_id}.img"] = pw.starts
    return result


def page_file_boundaries(images: Path, window: int = WINDOW) -> dict[str, list[int]]:
    """For every ``pages-N.img`` in ``images``, the file offsets where a new ``window``-aligned virtual
    address window begins (where chunks should start)."""
    return {name: window_boundaries(starts) for name, starts in page_file_windows(images, window).items()}


def window_boundaries(starts: dict[int, int]) -> list[int]:
    """Chunk boundaries (file offsets) from a page file's window starts."""
    return sorted(o for o in starts.values() if o > 0)
