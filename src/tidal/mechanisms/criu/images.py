"""Just enough of CRIU's image format to chunk page files well.

A ``pages-N.img`` holds the present pages of one process in address order; its ``pagemap`` image says
which virtual addresses they belong to. Cutting chunks at fixed virtual-address windows (instead of
fixed file offsets) means that a region that grows or shrinks changes only its own chunks, so a second
checkpoint stores only what really changed.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path

PAGE = 4096
PE_PRESENT = 1 << 2
_HEADER = 8  # two magic numbers


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


def _entries(path: Path) -> Iterator[dict[int, int]]:
    data = path.read_bytes()
    pos = _HEADER
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        yield _fields(data[pos : pos + size])
        pos += size


def page_file_windows(images: Path, window: int = 1 << 20) -> dict[str, dict[int, int]]:
    """For every ``pages-N.img`` in ``images``: the file offset at which each ``window``-aligned virtual
    address window starts (window index → offset). Unreadable pagemaps give nothing."""
    result: dict[str, dict[int, int]] = {}
    for pagemap in images.glob("pagemap-*.img"):
        if not re.fullmatch(r"pagemap-\d+\.img", pagemap.name):
            continue
        try:
            entries = _entries(pagemap)
            head = next(entries)
            pages_id = head.get(1, 0)
            starts: dict[int, int] = {}
            offset = 0
            for entry in entries:
                if not entry.get(4, 0) & PE_PRESENT:
                    continue
                vaddr, nr = entry.get(1, 0), entry.get(2, 0)
                first, last = vaddr // window, (vaddr + nr * PAGE - 1) // window
                for w in range(first, last + 1):
                    if w not in starts:
                        starts[w] = offset + (max(vaddr, w * window) - vaddr)
                offset += nr * PAGE
        except (IndexError, StopIteration, struct.error):
            continue
        result[f"pages-{pages_id}.img"] = starts
    return result


def page_file_boundaries(images: Path, window: int = 1 << 20) -> dict[str, list[int]]:
    """For every ``pages-N.img`` in ``images``, the file offsets where a new ``window``-aligned virtual
    address window begins (where chunks should start)."""
    return {name: window_boundaries(starts) for name, starts in page_file_windows(images, window).items()}


def window_boundaries(starts: dict[int, int]) -> list[int]:
    """Chunk boundaries (file offsets) from a page file's window starts."""
    return sorted(o for o in starts.values() if o > 0)
