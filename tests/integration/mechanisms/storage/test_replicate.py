"""Replicating a committed checkpoint between stores (one region's to another's): only missing chunks cross,
each verified; the replica reads back byte for byte; a replication cut short starts again without copying
twice; a damaged source is refused and leaves nothing committed in the target."""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tidal.errors import CheckpointCorrupt
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.chunks import chunk_key
from tidal.mechanisms.storage.replicate import STALE_S, replicate
from tidal.testing.seaweedfs import SeaweedFS

CHUNK = 64 * 1024


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def take(store: CheckpointStore, files: dict[str, bytes], meta: dict[str, object]) -> str:
    with store.writer("job") as w:
        for name, data in files.items():
            w.add_bytes(name, data)
        w.add_symlink("fs/link", "pages.img")
        return w.commit(meta).id


def read_all(store: CheckpointStore, ck: str) -> dict[str, bytes]:
    r = store.reader("job", ck)
    return {n: r.read_bytes(n) for n in r.names() if r.entry(n).kind == "file"}


@pytest.fixture
def stores(tmp_path: Path) -> tuple[CheckpointStore, CheckpointStore]:
    return (CheckpointStore(tmp_path / "region-a", chunk_size=CHUNK),
            CheckpointStore(tmp_path / "region-b", chunk_size=CHUNK))


Stores = tuple[CheckpointStore, CheckpointStore]


def test_only_missing_chunks_cross_and_the_replica_is_identical(stores: Stores) -> None:
    a, b = stores
    pages = rand(40 * CHUNK, 1)
    first = take(a, {"pages.img": pages, "core.img": rand(3 * CHUNK + 5, 2)}, {"step": 1})
    progress: list[tuple[int, int]] = []
    r1 = replicate(a, b, "job", first, lambda done, total: progress.append((done, total)))
    assert (r1.chunks, r1.copied_chunks, r1.missing_bytes) == (44, 44, 43 * CHUNK + 5)
    assert progress[0] == (0, 43 * CHUNK + 5) and progress[-1] == (43 * CHUNK + 5, 43 * CHUNK + 5)
    assert read_all(b, first) == read_all(a, first)
    info_a, info_b = a.latest("job"), b.latest("job")
    assert info_a is not None and info_b is not None
    assert (info_b.id, info_b.created_at, info_b.meta) == (info_a.id, info_a.created_at, {"step": 1})
    assert b.reader("job", first).entry("fs/link").target == "pages.img"

    # The job ran on: 3 of 40 chunks of its memory changed. Pre-copy sent the rest already.
    changed = bytearray(pages)
    for i in (0, 17, 39):
        changed[i * CHUNK:(i + 1) * CHUNK] = rand(CHUNK, 100 + i)
    second = take(a, {"pages.img": bytes(changed), "core.img": rand(3 * CHUNK + 5, 2)}, {"step": 2})
    r2 = replicate(a, b, "job", second)
    assert (r2.copied_chunks, r2.missing_bytes) == (3, 3 * CHUNK)
    assert read_all(b, second)["pages.img"] == bytes(changed)
    b.verify("job", second)

    again = replicate(a, b, "job", second)
    assert again.already_there and again.copied_chunks == 0


def test_a_replication_cut_short_resumes_without_copying_twice(stores: Stores) -> None:
    a, b = stores
    ck = take(a, {"pages.img": rand(20 * CHUNK, 3)}, {})
    calls = 0

    def cut(done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 6:  # the start, then five chunks copied
            raise KeyboardInterrupt  # the agent stopped in the middle

    with pytest.raises(KeyboardInterrupt):
        replicate(a, b, "job", ck, cut)
    assert b.latest("job") is None  # nothing committed
    # The writer's abort removed what it wrote: nothing half-made is taken for the checkpoint.
    r = replicate(a, b, "job", ck)
    assert r.copied_chunks == 20 and read_all(b, ck) == read_all(a, ck)


def test_a_replica_left_by_a_dead_process_is_finished(stores: Stores, tmp_path: Path) -> None:
    a, b = stores
    ck = take(a, {"pages.img": rand(10 * CHUNK, 6), "core.img": rand(4 * CHUNK, 7)}, {})
    entries = {e.name: e for e in (a.reader("job", ck).entry(n) for n in a.reader("job", ck).names())}
    w = b.writer("job", ck)  # a replication whose process died after its first file: no abort, no commit
    w.add_copy(entries["core.img"], a)
    assert b.latest("job") is None
    prefix = tmp_path / "region-b" / "jobs" / "job" / ck
    for f in [*(prefix / "pending").iterdir(), prefix / "pending", prefix]:  # silent for longer than a live
        os.utime(f, (time.time() - STALE_S - 1,) * 2)                      # replication ever is
    r = replicate(a, b, "job", ck)
    assert (r.copied_chunks, r.missing_bytes) == (10, 10 * CHUNK)
    assert read_all(b, ck) == read_all(a, ck)


def test_a_damaged_source_chunk_is_refused(stores: Stores, tmp_path: Path) -> None:
    a, b = stores
    data = rand(6 * CHUNK, 4)
    ck = take(a, {"pages.img": data}, {})
    digest = a.reader("job", ck).entry("pages.img").chunks[2][0]
    obj = tmp_path / "region-a" / chunk_key(digest)
    raw = bytearray(obj.read_bytes())
    raw[-1] ^= 0xFF
    obj.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupt, match=f"chunk {digest} in .*region-a is corrupt"):
        replicate(a, b, "job", ck)
    assert b.latest("job") is None
    assert not (tmp_path / "region-b" / chunk_key(digest)).exists()


def test_replications_of_one_checkpoint_at_once_copy_it_once(stores: Stores) -> None:
    """The nodes of a restore in one region each replicate the checkpoint: one copies, the others wait."""
    a, b = stores
    ck = take(a, {"pages.img": rand(30 * CHUNK, 8)}, {})
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda _: replicate(a, b, "job", ck), range(3)))
    assert sorted(r.copied_chunks for r in done) == [0, 0, 30]
    assert sum(r.already_there for r in done) == 2
    assert read_all(b, ck) == read_all(a, ck)


@pytest.mark.s3
def test_between_two_s3_stores(seaweedfs: SeaweedFS, tmp_path: Path) -> None:
    """Region A's store on S3 to region B's (another bucket): the objects cross as stored."""
    seaweedfs.create_bucket("region-b")
    a = CheckpointStore(tmp_path / "region-a", chunk_size=CHUNK)
    b = CheckpointStore("s3://region-b/replicas", chunk_size=CHUNK, **seaweedfs.store_options())
    try:
        ck = take(a, {"pages.img": rand(12 * CHUNK, 5) + bytes(4 * CHUNK)}, {"step": 9})
        r = replicate(a, b, "job", ck)
        assert r.copied_chunks == 13  # 12 random chunks and the one zero chunk the 4 share
        assert read_all(b, ck) == read_all(a, ck)
        back = CheckpointStore(tmp_path / "region-c", chunk_size=CHUNK)
        assert replicate(b, back, "job", ck).copied_chunks == 13
        assert read_all(back, ck) == read_all(a, ck)
    finally:
        b.close()
