"""add_file(previous=...): unchanged ranges take their known digest, and the result is exactly what
hashing everything would give."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tidal.mechanisms.storage import CheckpointStore

CHUNK = 64 << 10


def _digests(data: bytes, chunk: int = CHUNK) -> list[str]:
    return [hashlib.sha256(data[i : i + chunk]).hexdigest() for i in range(0, len(data), chunk)]


def test_previous_gives_the_same_manifest_as_hashing(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"), chunk_size=CHUNK)
    old = bytearray(os.urandom(16 * CHUNK))
    first = tmp_path / "first.img"
    first.write_bytes(old)
    w = store.writer("j")
    e1 = w.add_file("pages.img", first)
    w.commit({})
    new = bytearray(old)
    new[3 * CHUNK + 5] ^= 0xFF  # chunk 3 changes
    new[15 * CHUNK :] = os.urandom(CHUNK)  # and the last one
    second = tmp_path / "second.img"
    second.write_bytes(new)
    w = store.writer("j")
    e2 = w.add_file("pages.img", second, previous=(first, e1))
    info = w.commit({})
    assert [h for h, _ in e2.chunks] == _digests(bytes(new))
    assert info.stored_bytes < 3 * CHUNK  # two new chunks and a manifest
    assert store.reader("j", info.id).read_bytes("pages.img") == bytes(new)


def test_missing_previous_file_falls_back_to_hashing(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"), chunk_size=CHUNK)
    data = os.urandom(3 * CHUNK)
    f = tmp_path / "f.img"
    f.write_bytes(data)
    w = store.writer("j")
    e1 = w.add_file("a", f)
    e2 = w.add_file("b", f, previous=(tmp_path / "gone.img", e1))
    w.commit({})
    assert e1.chunks == e2.chunks
