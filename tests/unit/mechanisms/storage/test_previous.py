"""add_file(previous=...): unchanged ranges take their known digest, and the result is exactly what
hashing everything would give."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tidal.errors import CheckpointError
from tidal.mechanisms.storage import CheckpointReader, CheckpointStore, Entry

CHUNK = 64 << 10


def _digests(data: bytes, chunk: int = CHUNK) -> list[str]:
    return [hashlib.sha256(data[i : i + chunk]).hexdigest() for i in range(0, len(data), chunk)]


def _two_versions(
    tmp_path: Path, old: bytes | bytearray, new: bytes | bytearray
) -> tuple[CheckpointStore, Entry, Entry, str]:
    """A store with ``old`` committed as pages.img, then ``new``: both entries, and the second's id."""
    store = CheckpointStore(str(tmp_path / "store"), chunk_size=CHUNK)
    src = tmp_path / "v.img"
    entries = []
    for data in (old, new):
        src.write_bytes(data)
        w = store.writer("j")
        entries.append(w.add_file("pages.img", src))
        last = w.commit({}).id
    return store, entries[0], entries[1], last


def _counting_fetches(reader: CheckpointReader) -> list[int]:
    """The chunk indices ``reader`` fetches from the store from now on."""
    fetched: list[int] = []
    real_fetch = reader._fetch

    def counting(entry, digest, n, sink, off, fetch_zero, buf):  # type: ignore[no-untyped-def]
        fetched.append(off // CHUNK)
        return real_fetch(entry, digest, n, sink, off, fetch_zero, buf)

    reader._fetch = counting  # type: ignore[method-assign]
    return fetched


def _consume(store: CheckpointStore, last: str, e1: Entry, old: bytes | bytearray, base: Path,
             dest: Path) -> tuple[Path, int, list[int]]:
    """Stage ``old`` (committed as ``e1``) at ``base``, then extract checkpoint ``last``'s pages.img to
    ``dest`` consuming it: ``dest``, the base's inode, and the chunks fetched from the store."""
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_bytes(old)
    inode = base.stat().st_ino
    reader = store.reader("j", last)
    fetched = _counting_fetches(reader)
    reader.extract_all([("pages.img", dest)], bases={"pages.img": (base, e1)}, consume_bases=True)
    return dest, inode, fetched


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


def test_extract_with_a_base_fetches_only_what_it_lacks(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"), chunk_size=CHUNK)
    old = bytearray(os.urandom(12 * CHUNK))
    old[5 * CHUNK : 6 * CHUNK] = bytes(CHUNK)  # a zero chunk in the old version
    src = tmp_path / "v1.img"
    src.write_bytes(old)
    w = store.writer("j")
    e1 = w.add_file("pages.img", src)
    w.commit({})
    new = bytearray(old)
    new[3 * CHUNK : 4 * CHUNK] = os.urandom(CHUNK)
    new[5 * CHUNK : 6 * CHUNK] = os.urandom(CHUNK)  # the zero chunk gets data
    new[7 * CHUNK : 8 * CHUNK] = bytes(CHUNK)  # a data chunk becomes zeros
    new = new[CHUNK:11 * CHUNK]  # and the file shrinks and shifts: no chunk stays at its offset
    src.write_bytes(new)
    w = store.writer("j")
    w.add_file("pages.img", src)
    info = w.commit({})
    base = tmp_path / "staged.img"
    base.write_bytes(old)  # verified copy of the first checkpoint, staged earlier
    reader = store.reader("j", info.id)
    fetched: list[str] = []
    real_fetch = reader._fetch

    def counting(entry, digest, n, sink, off, fetch_zero, buf):  # type: ignore[no-untyped-def]
        fetched.append(digest)
        return real_fetch(entry, digest, n, sink, off, fetch_zero, buf)

    reader._fetch = counting  # type: ignore[method-assign]
    dest = tmp_path / "out" / "pages.img"
    reader.extract_all([("pages.img", dest)], bases={"pages.img": (base, e1)})
    assert dest.read_bytes() == bytes(new)
    assert len(fetched) == 3  # chunks 2, 5 and 7 (the zero one without a read); the rest came from the base
    assert base.read_bytes() == bytes(old)


@pytest.mark.parametrize("shift", ["towards the start", "towards the end", "both ways"])
def test_a_consumed_base_whose_chunks_moved_is_rearranged_in_place(tmp_path: Path, shift: str) -> None:
    """CRIU page files shift when a memory region grows or shrinks: the base's chunks are moved within
    it (in an order that never reads what was already overwritten), and only new content is fetched."""
    old = os.urandom(10 * CHUNK)
    fresh = os.urandom(CHUNK)
    if shift == "towards the start":
        new = old[2 * CHUNK :] + fresh  # two chunks gone at the start, one new at the end
    elif shift == "towards the end":
        new = fresh + old[: 7 * CHUNK] + bytes(CHUNK) + old[7 * CHUNK :]  # one new first, zeros inserted
    else:
        new = old[CHUNK : 5 * CHUNK] + fresh + fresh + old[: CHUNK] + old[5 * CHUNK :]
    store, e1, _, last = _two_versions(tmp_path, old, new)
    base = tmp_path / "pages.old"
    dest, inode, fetched = _consume(store, last, e1, old, base, tmp_path / "out" / "pages.img")
    assert dest.read_bytes() == bytes(new)
    assert dest.stat().st_ino == inode and not base.exists()
    # Both ways: six chunks' worth move towards the end, four towards the start; those four are fetched
    # instead, with the two new ones.
    want = {"towards the start": [8], "towards the end": [0], "both ways": [0, 1, 2, 3, 4, 5]}[shift]
    assert sorted(fetched) == want


def test_a_consumed_base_is_patched_in_place(tmp_path: Path) -> None:
    old = bytearray(os.urandom(12 * CHUNK))
    old[5 * CHUNK : 6 * CHUNK] = bytes(CHUNK)
    new = bytearray(old)
    new[3 * CHUNK : 4 * CHUNK] = os.urandom(CHUNK)
    new[5 * CHUNK : 6 * CHUNK] = os.urandom(CHUNK)  # the zero chunk gets data
    new[7 * CHUNK : 8 * CHUNK] = bytes(CHUNK)  # a data chunk becomes zeros
    new += os.urandom(CHUNK // 2)  # and the file grows
    store, e1, e2, last = _two_versions(tmp_path, old, new)
    base = tmp_path / "staged" / "pages.img"
    dest, inode, fetched = _consume(store, last, e1, old, base, tmp_path / "out" / "pages.img")
    assert dest.read_bytes() == bytes(new)
    assert sorted(fetched) == [3, 5, 12]  # the zero chunk is written, not fetched; the rest stayed put
    assert dest.stat().st_ino == inode and not base.exists()  # the base became the file
    assert oct(dest.stat().st_mode & 0o777) == oct(e2.mode)


def test_a_base_patched_in_place_that_fails_is_removed(tmp_path: Path) -> None:
    """A chunk missing from the store fails the extraction: the half-patched base is neither the old nor
    the new file, so it is removed, and nothing is left at the destination."""
    old = os.urandom(4 * CHUNK)
    new = old[: 3 * CHUNK] + os.urandom(CHUNK)
    store, e1, e2, last = _two_versions(tmp_path, old, new)
    (tmp_path / "store" / "chunks" / e2.chunks[3][0][:2] / e2.chunks[3][0]).unlink()
    base = tmp_path / "pages.old"
    base.write_bytes(old)
    dest = tmp_path / "out" / "pages.img"
    with pytest.raises(CheckpointError, match=f"chunk {e2.chunks[3][0]} is missing from the store"):
        store.reader("j", last).extract_all([("pages.img", dest)], bases={"pages.img": (base, e1)},
                                            consume_bases=True)
    assert not base.exists() and not dest.exists()


def test_retain_keeps_everything_when_there_are_fewer_than_keep(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"), chunk_size=CHUNK)
    ids = []
    for i in range(2):
        w = store.writer("j")
        w.add_bytes("x", bytes([i]) * 10)
        ids.append(w.commit({}).id)
    assert store.retain("j", 3) == []
    assert [c.id for c in store.list("j")] == ids
    assert store.retain("j", 1) == ids[:1]
    assert [c.id for c in store.list("j")] == ids[1:]


def test_a_base_on_another_file_system_is_copied_from_not_consumed(tmp_path: Path) -> None:
    old = os.urandom(4 * CHUNK)
    new = old[: 3 * CHUNK] + os.urandom(CHUNK)
    store, e1, _, last = _two_versions(tmp_path, old, new)
    other = Path("/dev/shm")
    assert os.stat(other).st_dev != os.stat(tmp_path).st_dev
    base = other / f"tidal-test-base-{os.getpid()}.img"
    base.write_bytes(old)
    try:
        dest = tmp_path / "out" / "pages.img"
        store.reader("j", last).extract_all([("pages.img", dest)], bases={"pages.img": (base, e1)},
                                            consume_bases=True)
        assert dest.read_bytes() == new
        assert base.read_bytes() == old  # a rename cannot cross file systems: the base was only read
    finally:
        base.unlink()


def test_digests_given_for_chunks_in_the_store_are_taken_without_reading(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"), chunk_size=CHUNK)
    old = os.urandom(4 * CHUNK)
    f = tmp_path / "pages.img"
    f.write_bytes(old)
    w = store.writer("j")
    e1 = w.add_file("pages.img", f)
    w.commit({})
    d = [h for h, _ in e1.chunks]
    new = old[: 2 * CHUNK] + os.urandom(CHUNK) + old[3 * CHUNK :]
    f.write_bytes(new)
    w = store.writer("j")
    # Chunk 2's given digest is in no store: it is read and hashed. Chunk 1's says chunk 0's content: as
    # it is in the store, it is taken as given (the caller vouches that those bytes did not change).
    given = {(0, CHUNK): d[0], (CHUNK, CHUNK): d[0], (2 * CHUNK, CHUNK): "f" * 64, (3 * CHUNK, CHUNK): d[3]}
    e2 = w.add_file("pages.img", f, digests=given)
    info = w.commit({})
    assert [h for h, _ in e2.chunks] == [d[0], d[0], _digests(new)[2], d[3]]
    assert store.reader("j", info.id).read_bytes("pages.img")[2 * CHUNK : 3 * CHUNK] == new[2 * CHUNK : 3 * CHUNK]
