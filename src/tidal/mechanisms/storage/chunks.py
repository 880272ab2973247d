"""Chunks: how a file is cut, and how one chunk is encoded as a store object.

A chunk object is one tag byte followed by the payload: ``R`` (raw bytes) or ``Z`` (one zstd frame).
The tag makes every object self-describing, so a writer that finds a chunk already stored (dedup)
never needs to know how another writer encoded it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import threading
from collections.abc import Sequence

import zstandard

from tidal.errors import UndecodableChunk, ValidationError

RAW = b"R"
ZSTD = b"Z"

#: Compressed output must save at least this fraction, else the chunk is stored raw (cheaper to read).
_MIN_SAVING = 1 / 32
_SAMPLE = 4096


def chunk_key(digest: str) -> str:
    """The store key of the chunk whose uncompressed content has sha256 ``digest``."""
    return f"chunks/{digest[:2]}/{digest}"


def check_chunk_size(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValidationError(f"chunk_size must be positive, not {chunk_size}", field="chunk_size",
                              hint="a chunk size in bytes, e.g. 4 MiB")


def plan(size: int, boundaries: Sequence[int], chunk_size: int) -> list[tuple[int, int]]:
    """Cut ``[0, size)`` into ``(offset, length)`` chunks that start at every boundary.

    Inside each segment between boundaries, chunks are ``chunk_size`` long (the last one shorter), so a
    segment that grows or shrinks does not shift the chunks of any other segment.
    """
    check_chunk_size(chunk_size)
    cuts: set[int] = set()
    for b in boundaries:
        if not isinstance(b, int) or b < 0 or b > size:
            raise ValidationError(f"boundary {b!r} is outside the file (size {size})", field="boundaries",
                                  hint=f"give offsets from 0 to {size}")
        cuts.add(b)
    edges = sorted(cuts | {0, size})
    out: list[tuple[int, int]] = []
    for start, end in itertools.pairwise(edges):
        off = start
        while off < end:
            n = min(chunk_size, end - off)
            out.append((off, n))
            off += n
    return out


@functools.lru_cache(maxsize=32)
def zeros(n: int) -> bytes:
    return bytes(n)


@functools.lru_cache(maxsize=32)
def zero_digest(n: int) -> str:
    """sha256 of ``n`` zero bytes (zero pages are common in process images; they skip hashing)."""
    return hashlib.sha256(zeros(n)).hexdigest()


def is_zero(base: bytes | bytearray, off: int, n: int) -> bool:
    """Whether ``base[off:off+n]`` is all zeros, without copying (startswith is a memcmp)."""
    if n == 0 or base[off] or base[off + n - 1]:
        return n == 0
    return base.startswith(zeros(n), off)


class Codec:
    """zstd encoding of chunk payloads; compressor objects are per thread (they are not thread-safe)."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._local = threading.local()

    def _compressor(self) -> zstandard.ZstdCompressor:
        c: zstandard.ZstdCompressor | None = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = zstandard.ZstdCompressor(level=self.level)
        return c

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        d: zstandard.ZstdDecompressor | None = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor()
        return d

    def encode(self, data: memoryview) -> tuple[bytes, bytes | memoryview]:
        """Return ``(tag, payload)``; raw payloads are the caller's buffer, not a copy.

        zstd level 1 gives up on incompressible input at several GB/s, so trying is the cheap check.
        """
        n = len(data)
        if n > 4 * _SAMPLE:
            # Compressing a few spread samples first avoids allocating and filling a full-size output
            # for random data (most of an image of numeric tensors).
            step = n // 4
            sample = b"".join(data[i * step : i * step + _SAMPLE] for i in range(4))
            if len(self._compressor().compress(sample)) > len(sample) * (1 - _MIN_SAVING):
                return RAW, data
        packed = self._compressor().compress(data)
        if len(packed) < n - n * _MIN_SAVING:
            return ZSTD, packed
        return RAW, data

    def decode(self, obj: bytes | memoryview, size: int) -> bytes | memoryview:
        """Payload of a stored chunk object; raises :class:`UndecodableChunk` saying what is wrong with it."""
        if not len(obj):
            raise _undecodable("truncated", "truncated: empty object")
        body = memoryview(obj)
        tag = bytes(body[:1])
        body = body[1:]
        if tag == RAW:
            if len(body) != size:
                raise _undecodable("truncated", f"truncated: {len(body)} bytes instead of {size}")
            return body
        if tag == ZSTD:
            try:
                out = self._decompressor().decompress(body, max_output_size=size)
            except zstandard.ZstdError as e:
                raise _undecodable("undecodable zstd frame", f"undecodable zstd frame ({e})") from None
            if len(out) != size:
                raise _undecodable("truncated", f"truncated: decodes to {len(out)} bytes instead of {size}")
            return out
        raise _undecodable("undecodable", f"undecodable: unknown chunk tag {tag!r}")


def _undecodable(reason: str, message: str) -> UndecodableChunk:
    return UndecodableChunk(message, reason=reason,
                            hint="the store's copy of this chunk is damaged: a checkpoint that holds it cannot "
                                 "be restored")
