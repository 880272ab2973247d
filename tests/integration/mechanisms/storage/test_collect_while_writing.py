"""Garbage collection run by another process's store (the control plane's collector) while a real writer is
paused in the middle of a checkpoint, on a local directory and on S3 (SeaweedFS): the chunks the writer put
and the chunks it found already there survive or are put again, and the checkpoint restores byte for byte."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.chunks import chunk_key

CHUNK = 64 * 1024


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture(params=["dir", "s3"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[CheckpointStore, CheckpointStore]]:
    """Two stores on the same place: the agent's (writes) and the control plane's (collects)."""
    if request.param == "dir":
        opts: dict[str, Any] = {}
        url: str = str(tmp_path / "store")
    else:
        server = request.getfixturevalue("seaweedfs")
        url = request.getfixturevalue("s3_url")
        opts = server.store_options()
    agent = CheckpointStore(url, chunk_size=CHUNK, gc_grace=0, **opts)
    collector = CheckpointStore(url, chunk_size=CHUNK, gc_grace=0, **opts)
    yield agent, collector
    agent.backend.delete_tree("")
    agent.close()
    collector.close()


class Pause:
    """Wraps a backend method: the ``at``-th call (from 1) signals ``reached`` and waits for ``go``; ``after``
    says whether it waits after the call (the object is put) or before returning its answer."""

    def __init__(self, obj: Any, name: str, at: int = 1) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        self.calls = 0
        self.lock = threading.Lock()
        inner: Callable[..., Any] = getattr(obj, name)

        def paused(*a: Any, **kw: Any) -> Any:
            out = inner(*a, **kw)
            with self.lock:
                self.calls += 1
                mine = self.calls == at
            if mine:
                self.reached.set()
                assert self.go.wait(60)
            return out

        setattr(obj, name, paused)


def write_in_thread(store: CheckpointStore, job: str, files: dict[str, Path]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            w = store.writer(job)
            for name, path in files.items():
                w.add_file(name, path)
            out.append(w.commit({}))
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def digests(data: bytes) -> set[str]:
    return {hashlib.sha256(data[i : i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)}


def chunk_names(store: CheckpointStore) -> set[str]:
    return {n for k, _ in store.backend.chunks() if not (n := k.rsplit("/", 1)[-1]).startswith(".")}


def test_chunks_a_writer_put_survive_a_collection_before_its_refs_name_them(
        stores: tuple[CheckpointStore, CheckpointStore], tmp_path: Path) -> None:
    agent, collector = stores
    data = rand(8 * CHUNK, 1)
    img = tmp_path / "pages.img"
    img.write_bytes(data)
    pause = Pause(agent.backend, "put_chunk", at=3)
    t, out = write_in_thread(agent, "job", {"pages.img": img})
    try:
        assert pause.reached.wait(30)
        put = chunk_names(collector)
        assert len(put) >= 3  # written, named by no refs or manifest yet
        assert collector.gc() == 0
        assert chunk_names(collector) >= put
    finally:
        pause.go.set()
        t.join(30)
    info = out[0]
    assert not isinstance(info, BaseException), info
    assert [c.id for c in collector.list("job")] == [info.id]
    collector.verify("job", info.id)
    assert collector.reader("job", info.id).read_bytes("pages.img") == data
    assert collector.gc() == 0  # every chunk is the checkpoint's


def test_chunks_a_writer_found_are_put_again_when_collected_under_it(
        stores: tuple[CheckpointStore, CheckpointStore], tmp_path: Path) -> None:
    """The race docs/store.md used to name as a known limit: a chunk found in the store (a dedup hit) whose only
    checkpoint is deleted and collected before the writer's refs name it."""
    agent, collector = stores
    shared = rand(4 * CHUNK, 2)
    old = tmp_path / "old.img"
    old.write_bytes(shared)
    w = agent.writer("other")
    w.add_file("pages.img", old)
    first = w.commit({})
    time.sleep(1.1)  # S3 says when an object was written to the second: the chunks are older than the writer
    data = shared + rand(2 * CHUNK, 3)
    img = tmp_path / "pages.img"
    img.write_bytes(data)
    pause = Pause(agent.backend, "exists", at=1)  # the writer found the first shared chunk, refs not yet put
    t, out = write_in_thread(agent, "job", {"pages.img": img})
    try:
        assert pause.reached.wait(30)
        assert collector.retain("other", 0) == [first.id]  # deletes the only checkpoint naming the shared chunks
        assert not chunk_names(collector) & digests(shared)  # ... and collects them: nothing names them yet
    finally:
        pause.go.set()
        t.join(60)
    info = out[0]
    assert not isinstance(info, BaseException), info
    # The writer saw the collection, waited it out and put back what it had found and lost.
    assert [c.id for c in collector.list("job")] == [info.id]
    collector.verify("job", info.id)
    assert collector.reader("job", info.id).read_bytes("pages.img") == data
    assert chunk_names(collector) == digests(data)
    assert all(collector.backend.exists(chunk_key(h)) for h in digests(data))


def test_a_collection_with_no_writer_removes_what_nothing_names(
        stores: tuple[CheckpointStore, CheckpointStore], tmp_path: Path) -> None:
    agent, collector = stores
    w = agent.writer("job")
    w.add_bytes("a", rand(3 * CHUNK, 4))
    first = w.commit({})
    w = agent.writer("job")
    w.add_bytes("a", rand(2 * CHUNK, 5))
    second = w.commit({})
    time.sleep(1.1)
    assert collector.keep_only("job", {second.id}) == [first.id]
    assert len(chunk_names(collector)) == 2
    assert collector.reader("job", second.id).read_bytes("a") == rand(2 * CHUNK, 5)
