"""Writing CRIU pagemap images for tests: a header, then size-prefixed protobuf entries of varints."""

from __future__ import annotations

import struct

MAGIC = struct.pack("<II", 0x54564319, 0x56084025)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def entry(fields: dict[int, int]) -> bytes:
    """One entry: the head ``{1: pages_id}``, or a page run ``{1: vaddr, 2: nr_pages, 4: flags}``."""
    body = b"".join(varint(k << 3) + varint(v) for k, v in fields.items())
    return struct.pack("<I", len(body)) + body
