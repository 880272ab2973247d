"""Chunk planning and chunk encoding."""

from __future__ import annotations

import hashlib
import os

import pytest

from tidal.errors import UndecodableChunk, ValidationError
from tidal.mechanisms.storage.chunks import RAW, ZSTD, Codec, is_zero, plan, zero_digest


def test_plan_cuts_at_chunk_size() -> None:
    assert plan(0, (), 10) == []
    assert plan(25, (), 10) == [(0, 10), (10, 10), (20, 5)]
    assert plan(20, (), 10) == [(0, 10), (10, 10)]


def test_plan_starts_a_chunk_at_every_boundary() -> None:
    assert plan(25, (3, 3, 0, 25, 14), 10) == [(0, 3), (3, 10), (13, 1), (14, 10), (24, 1)]
    with pytest.raises(ValidationError, match="outside the file"):
        plan(25, (26,), 10)
    with pytest.raises(ValidationError, match="outside the file"):
        plan(25, (-1,), 10)
    with pytest.raises(ValidationError, match="chunk_size"):
        plan(25, (), 0)


def test_codec_round_trip_and_choice() -> None:
    codec = Codec(1)
    random_data = os.urandom(1 << 20)
    tag, payload = codec.encode(memoryview(random_data))
    assert tag == RAW and bytes(payload) == random_data
    text = b"".join(b"%08d\n" % i for i in range(100_000))
    tag, payload = codec.encode(memoryview(text))
    assert tag == ZSTD and len(payload) < len(text) // 3
    assert codec.decode(tag + bytes(payload), len(text)) == text
    assert bytes(codec.decode(RAW + b"abc", 3)) == b"abc"


@pytest.mark.parametrize(
    ("obj", "size", "message"),
    [
        (b"", 3, "truncated"),
        (RAW + b"ab", 3, "truncated"),
        (b"Q" + b"abc", 3, "undecodable"),
        (ZSTD + b"not zstd", 3, "undecodable"),
    ],
)
def test_codec_names_the_fault(obj: bytes, size: int, message: str) -> None:
    with pytest.raises(UndecodableChunk, match=message):
        Codec(1).decode(obj, size)


def test_zero_detection() -> None:
    buf = bytearray(8192)
    assert is_zero(buf, 0, 8192) and is_zero(buf, 100, 50) and is_zero(buf, 0, 0)
    buf[4000] = 1
    assert not is_zero(buf, 0, 8192) and is_zero(buf, 4001, 4191) and not is_zero(buf, 3999, 2)
    assert zero_digest(4096) == hashlib.sha256(bytes(4096)).hexdigest()
