"""Contract suite of the checkpoint store: every test runs against a local directory and memory://."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.errors import CheckpointCorrupt, CheckpointError, ValidationError
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.chunks import chunk_key
from tidal.mechanisms.storage.manifest import file_digest

CHUNK = 64 * 1024  # small chunks keep the files of these tests small


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CheckpointStore]:
    if request.param == "local":
        s = CheckpointStore(tmp_path / "store", chunk_size=CHUNK)
        yield s
        s.close()
    else:
        import fsspec

        root = f"memory://tidal-test-{uuid.uuid4().hex}"
        s = CheckpointStore(root, chunk_size=CHUNK)
        yield s
        s.close()
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


def chunk_keys(store: CheckpointStore) -> set[str]:
    b = store.backend
    return {f"chunks/{d}/{n}" for d in b.listdir("chunks") for n in b.listdir(f"chunks/{d}")}


def write_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_round_trip_is_byte_identical(store: CheckpointStore, tmp_path: Path) -> None:
    big = rand(5 * CHUNK + 123, 1)
    text = b"hello\n" * 20000  # compressible
    empty = b""
    w = store.writer("job")
    w.add_file("rank-0/pages-1.img", write_file(tmp_path / "a", big), mode=0o640)
    w.add_file("fs/out.txt", write_file(tmp_path / "b", text))
    w.add_bytes("fs/empty", empty)
    w.add_bytes("meta.bin", b"\x00" * (2 * CHUNK + 5))
    w.add_symlink("fs/link", "out.txt")
    info = w.commit({"step": 7, "offsets": {"log": 12}})

    assert info.job_id == "job"
    assert info.files == 5
    assert info.logical_bytes == len(big) + len(text) + 2 * CHUNK + 5
    assert info.meta == {"step": 7, "offsets": {"log": 12}}
    assert store.list("job") == [info]
    assert store.latest("job") == info

    r = store.reader("job", info.id)
    assert r.info == info
    assert r.meta == {"step": 7, "offsets": {"log": 12}}
    assert r.names() == ["rank-0/pages-1.img", "fs/out.txt", "fs/empty", "meta.bin", "fs/link"]
    e = r.entry("rank-0/pages-1.img")
    assert (e.kind, e.size, e.mode) == ("file", len(big), 0o640)
    assert e.sha256 == file_digest(len(big), e.chunks)
    want = [hashlib.sha256(big[i : i + n]).hexdigest() for i, n in _offsets(e.chunks)]
    assert [h for h, _ in e.chunks] == want
    assert r.entry("fs/link").kind == "symlink"
    assert r.read_bytes("fs/out.txt") == text
    assert r.read_bytes("fs/empty") == b""
    assert r.read_bytes("meta.bin") == b"\x00" * (2 * CHUNK + 5)

    out = tmp_path / "restored"
    r.extract_all(
        [
            ("rank-0/pages-1.img", out / "pages-1.img"),
            ("fs/out.txt", out / "data" / "out.txt"),
            ("fs/empty", out / "empty"),
            ("meta.bin", out / "meta.bin"),
            ("fs/link", out / "link"),
        ]
    )
    assert (out / "pages-1.img").read_bytes() == big
    assert (out / "pages-1.img").stat().st_mode & 0o777 == 0o640
    assert (out / "data" / "out.txt").read_bytes() == text
    assert (out / "empty").read_bytes() == b""
    assert (out / "meta.bin").read_bytes() == b"\x00" * (2 * CHUNK + 5)
    assert os.readlink(out / "link") == "out.txt"
    assert sorted(p.name for p in out.iterdir()) == ["data", "empty", "link", "meta.bin", "pages-1.img"]
    store.verify("job", info.id)


def test_compressible_data_is_stored_compressed(store: CheckpointStore) -> None:
    text = "".join(f"line {i:08d}\n" for i in range(100_000)).encode()  # distinct but compressible chunks
    w = store.writer("job")
    w.add_bytes("text", text)
    info = w.commit({})
    assert info.logical_bytes == len(text)
    assert info.stored_bytes < len(text) // 3
    assert store.reader("job", info.id).read_bytes("text") == text


def test_dedup_across_checkpoints_and_ranks(store: CheckpointStore, tmp_path: Path) -> None:
    data = rand(8 * CHUNK, 2)
    src = write_file(tmp_path / "img", data)
    w = store.writer("job")
    w.add_file("rank-0/pages.img", src)
    w.add_file("rank-1/pages.img", src)  # an identical data-parallel rank
    first = w.commit({})
    assert len(chunk_keys(store)) == 8
    assert 8 * CHUNK < first.stored_bytes < 8 * CHUNK + 8 + 4096  # each chunk once, plus the manifest

    w = store.writer("job")
    w.add_file("rank-0/pages.img", src)
    second = w.commit({})
    assert len(chunk_keys(store)) == 8
    assert second.stored_bytes < 4096  # only the manifest
    assert second.logical_bytes == 8 * CHUNK
    assert store.reader("job", second.id).read_bytes("rank-0/pages.img") == data

    w = store.writer("other-job")  # dedup also holds across jobs
    w.add_file("x", src)
    assert w.commit({}).stored_bytes < 4096


def test_boundaries_start_chunks(store: CheckpointStore, tmp_path: Path) -> None:
    data = rand(3 * CHUNK, 3)
    w = store.writer("job")
    w.add_file("f", write_file(tmp_path / "f", data), boundaries=[100, CHUNK + 100, 100])
    info = w.commit({})
    e = store.reader("job", info.id).entry("f")
    assert [n for _, n in e.chunks] == [100, CHUNK, CHUNK, CHUNK - 100]
    assert [h for h, _ in e.chunks] == [
        hashlib.sha256(data[a:b]).hexdigest()
        for a, b in [
            (0, 100),
            (100, CHUNK + 100),
            (CHUNK + 100, 2 * CHUNK + 100),
            (2 * CHUNK + 100, 3 * CHUNK),
        ]
    ]

    # A region that grows in front shifts no chunk of the regions after it.
    region_a, region_b = rand(CHUNK // 2, 4), rand(2 * CHUNK, 5)
    grown_a = region_a + rand(4096, 6)
    w = store.writer("job")
    w.add_file("f", write_file(tmp_path / "g1", region_a + region_b), boundaries=[len(region_a)])
    before = chunk_keys(store)
    w.add_file("g", write_file(tmp_path / "g2", grown_a + region_b), boundaries=[len(grown_a)])
    w.commit({})
    assert len(chunk_keys(store) - before) == 1  # only the grown region's chunk is new

    w = store.writer("job")
    with pytest.raises(ValidationError, match="outside the file"):
        w.add_file("h", tmp_path / "f", boundaries=[3 * CHUNK + 1])
    w.abort()


def test_uncommitted_writer_is_invisible(store: CheckpointStore, tmp_path: Path) -> None:
    w = store.writer("job")
    w.add_bytes("a", rand(1000, 7))
    assert store.list("job") == []
    assert store.latest("job") is None
    with pytest.raises(CheckpointError, match="never committed") as err:
        store.reader("job", w.id)
    # Not a verification failure: nothing committed was damaged (or this is not the store written to).
    assert not isinstance(err.value, CheckpointCorrupt)
    info = w.commit({})
    assert [i.id for i in store.list("job")] == [info.id]


def test_context_manager_aborts_on_exception(store: CheckpointStore) -> None:
    good = store.writer("job")
    good.add_bytes("a", b"good")
    good_info = good.commit({})
    with pytest.raises(RuntimeError), store.writer("job") as w:
        w.add_bytes("a", rand(3 * CHUNK, 8))
        raise RuntimeError("dump failed")
    assert w.state == "aborted"
    assert store.list("job") == [good_info]
    assert store.backend.listdir(f"jobs/job/{w.id}") == []
    # The aborted writer's chunks are gone; the good checkpoint's chunk stays.
    assert chunk_keys(store) == {chunk_key(hashlib.sha256(b"good").hexdigest())}
    with store.writer("job") as w2:
        w2.add_bytes("a", b"x")
    assert w2.state == "aborted"  # leaving the block without commit also aborts
    assert store.list("job") == [good_info]


def test_ids_sort_by_sequence(store: CheckpointStore) -> None:
    ids = []
    for i in range(3):
        w = store.writer("job")
        w.add_bytes("x", str(i).encode())
        ids.append(w.commit({"i": i}).id)
    assert [int(i.split("-")[0]) for i in ids] == [1, 2, 3]
    assert [i.id for i in store.list("job")] == ids
    assert [i.meta["i"] for i in store.list("job")] == [0, 1, 2]
    assert all(ids[k] < ids[k + 1] for k in range(2))  # ids sort as strings too
    w = store.writer("job", "custom-1")
    assert w.id == "custom-1"
    w.abort()
    w = store.writer("job", "custom-1")  # an aborted id can be used again
    w.add_bytes("x", b"again")
    assert store.reader("job", w.commit({}).id).read_bytes("x") == b"again"
    with pytest.raises(CheckpointError, match="already exists"):
        store.writer("job", ids[0])
    with pytest.raises(ValidationError, match="invalid job id"):
        store.writer("../escape")
    w = store.writer("job")
    for bad in ["/abs", "a/../b", "", "a//b", "."]:
        with pytest.raises(ValidationError, match="invalid name"):
            w.add_bytes(bad, b"")
    w.add_bytes("x", b"")
    with pytest.raises(ValidationError, match="already in checkpoint"):
        w.add_bytes("x", b"")
    w.abort()


def flip_byte(store: CheckpointStore, key: str, at: int) -> None:
    raw = bytearray(store.backend.get(key))
    raw[at] ^= 0xFF
    store.backend.put(key, bytes(raw))


def two_checkpoints(store: CheckpointStore) -> tuple[str, str, bytes, bytes, str]:
    """A good checkpoint and a newer one with a chunk of its own; returns that chunk's digest."""
    shared = rand(CHUNK, 10)
    old, new = shared + rand(CHUNK, 11), shared + rand(CHUNK, 12)
    w = store.writer("job")
    w.add_bytes("pages.img", old)
    a = w.commit({})
    w = store.writer("job")
    w.add_bytes("pages.img", new)
    b = w.commit({})
    return a.id, b.id, old, new, hashlib.sha256(new[CHUNK:]).hexdigest()


@pytest.mark.parametrize("where", [0, 1, -1])
def test_flipped_byte_in_chunk_is_named(store: CheckpointStore, tmp_path: Path, where: int) -> None:
    a, b, old, _, bad = two_checkpoints(store)
    flip_byte(store, chunk_key(bad), where)  # 0: the tag byte; 1, -1: the payload
    r = store.reader("job", b)
    with pytest.raises(CheckpointCorrupt) as err:
        r.extract("pages.img", tmp_path / "out")
    assert "pages.img" in str(err.value) and bad in str(err.value)
    assert err.value.fields["object"] == "pages.img"
    assert err.value.fields["chunk"] == bad
    assert err.value.fields["checkpoint"] == b
    expected = "undecodable" if where == 0 else "sha256 mismatch"
    assert expected in str(err.value)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "store"] == []  # no temp file left behind
    with pytest.raises(CheckpointError, match=bad):
        store.verify("job", b)
    # The previous checkpoint is untouched and restorable.
    store.verify("job", a)
    store.reader("job", a).extract("pages.img", tmp_path / "old")
    assert (tmp_path / "old").read_bytes() == old


def test_missing_and_truncated_chunks_are_named(store: CheckpointStore, tmp_path: Path) -> None:
    a, b, old, _, bad = two_checkpoints(store)
    raw = store.backend.get(chunk_key(bad))
    store.backend.put(chunk_key(bad), raw[: len(raw) // 2])
    with pytest.raises(CheckpointCorrupt, match=f"'pages.img': chunk {bad} is truncated"):
        store.reader("job", b).read_bytes("pages.img")
    store.backend.delete(chunk_key(bad))
    with pytest.raises(CheckpointCorrupt, match=f"'pages.img': chunk {bad} is missing") as err:
        store.reader("job", b).read_bytes("pages.img")
    assert err.value.fields["reason"] == "missing" and err.value.fields["checkpoint"] == b
    assert store.reader("job", a).read_bytes("pages.img") == old


def test_corrupt_manifest_is_named(store: CheckpointStore) -> None:
    a, b, old, _, _ = two_checkpoints(store)
    key = f"jobs/job/{b}/manifest.json"
    raw = store.backend.get(key)
    store.backend.put(key, raw.replace(b'"size":', b'"size":1', 1))
    with pytest.raises(CheckpointCorrupt, match=f"manifest {key} is corrupt: sha256 mismatch") as err:
        store.reader("job", b)
    assert err.value.fields["checkpoint"] == b and err.value.fields["object"] == key
    store.backend.put(key, raw[: len(raw) // 2])
    with pytest.raises(CheckpointCorrupt, match=f"manifest {key} is undecodable") as err:
        store.verify("job", b)
    assert err.value.fields["checkpoint"] == b
    assert [i.id for i in store.list("job")] == [a]  # a damaged checkpoint is not offered for restore
    assert store.reader("job", a).read_bytes("pages.img") == old


def test_retain_keeps_newest_and_collects_chunks(store: CheckpointStore) -> None:
    shared = rand(CHUNK, 20)
    ids = []
    for i in range(4):
        w = store.writer("job")
        w.add_bytes("pages.img", shared + rand(CHUNK, 100 + i))
        ids.append(w.commit({}).id)
    w = store.writer("other")
    w.add_bytes("pages.img", rand(CHUNK, 100))  # the same chunk as the job's first checkpoint
    other = w.commit({})
    assert len(chunk_keys(store)) == 5

    assert store.retain("job", 2) == ids[:2]
    assert [i.id for i in store.list("job")] == ids[2:]
    # Left: the shared chunk, the two kept checkpoints' own chunks, and the chunk the other job uses.
    assert chunk_keys(store) == {
        chunk_key(hashlib.sha256(d).hexdigest())
        for d in [shared, rand(CHUNK, 102), rand(CHUNK, 103), rand(CHUNK, 100)]
    }
    assert store.backend.listdir(f"jobs/job/{ids[0]}") == []
    for cid in ids[2:]:
        store.verify("job", cid)
    store.verify("other", other.id)
    assert store.retain("job", 2) == []

    store.delete_job("other")
    assert store.list("other") == []
    assert len(chunk_keys(store)) == 3
    assert store.retain("job", 0) == ids[2:]
    assert chunk_keys(store) == set()


def test_in_progress_writer_survives_retain(store: CheckpointStore) -> None:
    w0 = store.writer("job")
    w0.add_bytes("pages.img", rand(2 * CHUNK, 30))
    old = w0.commit({})
    w = store.writer("job")
    new = rand(2 * CHUNK, 30)[:CHUNK] + rand(CHUNK, 31)  # one chunk reused, one new
    w.add_bytes("pages.img", new)
    relied = {chunk_key(hashlib.sha256(new[i : i + CHUNK]).hexdigest()) for i in (0, CHUNK)}
    assert store.retain("job", 0) == [old.id]  # deletes the old checkpoint while `w` is in progress
    # Both chunks `w` relies on survive. (On an object store a writer also keeps the chunks of the job's
    # newest committed checkpoint until it commits, and is spared asking about them.)
    assert relied <= chunk_keys(store)
    info = w.commit({})
    assert store.reader("job", info.id).read_bytes("pages.img") == new
    store.retain("job", 1)
    assert chunk_keys(store) == relied


def test_retain_concurrent_with_adds(store: CheckpointStore) -> None:
    """GC running in another thread while a writer adds many files never loses a chunk."""
    w0 = store.writer("job")
    for i in range(20):
        w0.add_bytes(f"f{i}", rand(CHUNK, 200 + i))
    w0.commit({})
    w = store.writer("job")
    stop = threading.Event()
    errors: list[BaseException] = []

    def collect() -> None:
        try:
            while not stop.is_set():
                store.retain("job", 0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=collect)
    t.start()
    try:
        for i in range(20):
            w.add_bytes(f"f{i}", rand(CHUNK, 200 + i))  # every chunk already exists: dedup hits
    finally:
        stop.set()
        t.join()
    assert errors == []
    info = w.commit({})
    store.verify("job", info.id)
    assert store.reader("job", info.id).read_bytes("f7") == rand(CHUNK, 207)


def test_commit_and_abort_end_the_writer(store: CheckpointStore) -> None:
    w = store.writer("job")
    w.add_bytes("a", b"1")
    w.commit({})
    w.abort()  # no-op after commit
    assert len(store.list("job")) == 1
    with pytest.raises(CheckpointError, match="already committed"):
        w.add_bytes("b", b"2")
    with pytest.raises(CheckpointError, match="already committed"):
        w.commit({})
    with pytest.raises(ValidationError, match="JSON"):
        store.writer("job").commit({"x": object()})


def _offsets(chunks: tuple[tuple[str, int], ...]) -> list[tuple[int, int]]:
    out, off = [], 0
    for _, n in chunks:
        out.append((off, n))
        off += n
    return out


def test_damaged_manifest_entry_and_misplaced_manifest_are_verification_failures(store: CheckpointStore) -> None:
    from dataclasses import replace

    from tidal.mechanisms.storage.manifest import Manifest

    a, b, old, _, _ = two_checkpoints(store)
    key = f"jobs/job/{b}/manifest.json"
    m = Manifest.decode(store.backend.get(key), key)
    # A well-formed manifest whose entry lies about its chunks.
    store.backend.put(key, replace(m, entries=(replace(m.entries[0], sha256="0" * 64),)).encode())
    with pytest.raises(CheckpointCorrupt, match="its chunk list does not match its sha256") as err:
        store.reader("job", b).read_bytes("pages.img")
    assert err.value.fields == {"checkpoint": b, "object": "pages.img", "reason": "sha256 mismatch"}
    store.backend.put(key, store.backend.get(f"jobs/job/{a}/manifest.json"))
    with pytest.raises(CheckpointCorrupt, match=f"manifest {key} belongs to checkpoint job/{a}") as err:
        store.reader("job", b)
    assert err.value.fields["checkpoint"] == b and err.value.fields["reason"] == "misplaced"
    assert store.reader("job", a).read_bytes("pages.img") == old
