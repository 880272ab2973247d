"""Checkpoint retention by the control plane's collector, over a real database and a real store: the exact
checkpoints left in the database and in the store after a pass (keep K per job, finished jobs after T, store
quotas per user), chunks collected while an agent's writer is paused in the middle of a checkpoint that then
restores byte for byte, and ``GET /v1/store/usage``."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tidal.control import tokens
from tidal.control.retention import Collector, Rules, parse_size, parse_store_quotas
from tidal.control.store.models import CheckpointRow, CheckpointState, EventRow, JobRow
from tidal.errors import ValidationError
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing.control import Plane

CHUNK = 64 * 1024
DAY = 86400.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CheckpointStore]:
    s = CheckpointStore(tmp_path / "store", chunk_size=CHUNK)
    yield s
    s.close()


def data(cid: str) -> bytes:
    return random.Random(cid).randbytes(2 * CHUNK)


def job(p: Plane, owner: str, state: str, *, finished_ago: float | None = None, name: str = "train") -> str:
    jid = p.submit(name=name)
    with p.db.tx() as s:
        row = s.get(JobRow, jid)
        assert row is not None
        row.owner, row.state = owner, state
        row.finished_at = None if finished_ago is None else time.time() - finished_ago
    return jid


def checkpoints(p: Plane, store: CheckpointStore, jid: str, *sizes: int, bad: int | None = None) -> list[str]:
    """Checkpoints of ``jid`` in the database and the store, oldest first, of the given sizes."""
    ids = []
    for i, size in enumerate(sizes):
        w = store.writer(jid)
        w.add_bytes("pages.img", data(w.id))
        info = w.commit({})
        ids.append(info.id)
        with p.db.tx() as s:
            s.add(CheckpointRow(id=info.id, job_id=jid, created_at=time.time() - 1000 + len(ids), bytes=size,
                                stored_bytes=size // 2, retained=True, parts=[info.id],
                                state=CheckpointState.BAD if i == bad else CheckpointState.COMMITTED))
    return ids


def kept_in_db(p: Plane) -> set[str]:
    with p.db.read() as s:
        return set(s.scalars(select(CheckpointRow.id).where(CheckpointRow.retained.is_(True))))


def kept_in_store(store: CheckpointStore) -> dict[str, list[str]]:
    return {j: [c.id for c in store.list(j)] for j in store.backend.listdir("jobs")}


def chunks(store: CheckpointStore) -> set[str]:
    return {k.rsplit("/", 1)[-1] for k, _ in store.backend.chunks()}


def chunks_of(store: CheckpointStore, kept: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for j, ids in kept.items():
        for c in ids:
            out |= {h for e in store.reader(j, c)._manifest.entries for h, _ in e.chunks}
    return out


def events(p: Plane, kind: str) -> list[tuple[str | None, str]]:
    with p.db.read() as s:
        return [(e.job_id, e.detail) for e in s.scalars(select(EventRow).where(EventRow.kind == kind)
                                                       .order_by(EventRow.seq))]


def test_keep_k_and_finished_jobs_after_t(tmp_path: Path, store: CheckpointStore) -> None:
    p = Plane(tmp_path)
    running = job(p, "alice", "running")
    a = checkpoints(p, store, running, 10, 10, 10, 10, bad=1)
    old = job(p, "alice", "succeeded", finished_ago=8 * DAY)
    b = checkpoints(p, store, old, 10, 10)
    recent = job(p, "alice", "failed", finished_ago=3600)
    c = checkpoints(p, store, recent, 10)
    with p.db.tx() as s:
        bob = tokens.create_user(s, "bob", "user")
    other = job(p, "bob", "preempted")
    d = checkpoints(p, store, other, 10, 10)
    collector = Collector(p.db, store, Rules(keep=2, finished_after=7 * DAY))

    assert sorted(collector.once()) == sorted([a[0], *b])
    # a[1] is bad: kept for inspection, not counted; a[2] and a[3] are the two newest good ones.
    assert kept_in_db(p) == {a[1], a[2], a[3], *c, *d}
    left = kept_in_store(store)
    assert left == {running: [a[1], a[2], a[3]], recent: c, other: d}  # the finished job's directory is gone
    assert chunks(store) == chunks_of(store, left)
    assert events(p, "checkpoints_deleted") == [
        (running, f"1 checkpoint(s) deleted (beyond the newest kept per job): {a[0]}"),
        (old, f"2 checkpoint(s) deleted (the job finished): {b[0]}, {b[1]}"),
    ]
    assert collector.once() == []  # nothing more to do
    assert kept_in_store(store) == left

    # finished_after 0: a finished job's checkpoints go at once.
    assert Collector(p.db, store, Rules(keep=2, finished_after=0)).once() == c
    assert kept_in_store(store) == {running: [a[1], a[2], a[3]], other: d}

    # What each user sees of the store, and an admin's --all.
    r = p.http.get("/v1/store/usage", headers=p.as_user())
    assert r.json() == {
        "users": [{"user": "alice", "jobs": 1, "checkpoints": 3, "bytes": 30, "stored_bytes": 15, "quota": None}],
        "jobs": [{"job": running, "name": "train", "owner": "alice", "state": "running", "checkpoints": 3,
                  "bytes": 30, "stored_bytes": 15}],
    }
    bob_view = p.http.get("/v1/store/usage", headers={"Authorization": f"Bearer {bob}"}, params={"all": True})
    assert [u["user"] for u in bob_view.json()["users"]] == ["bob"]  # not an admin: their own only
    p.db.close()


def test_a_user_over_quota_loses_finished_jobs_first_then_older_checkpoints(tmp_path: Path,
                                                                            store: CheckpointStore) -> None:
    p = Plane(tmp_path)
    done = job(p, "alice", "succeeded", finished_ago=3600)
    e = checkpoints(p, store, done, 100, 100)
    live = job(p, "alice", "running")
    f = checkpoints(p, store, live, 100, 100, 100)
    rules = Rules(keep=3, finished_after=7 * DAY, quotas={"alice": 250})
    assert Collector(p.db, store, rules).once() == [*e, f[0]]
    assert kept_in_db(p) == {f[1], f[2]}
    assert kept_in_store(store) == {live: [f[1], f[2]]}
    assert chunks(store) == chunks_of(store, kept_in_store(store))
    assert events(p, "checkpoints_deleted")[-1] == (live, f"1 checkpoint(s) deleted (over the store quota): {f[0]}")


def test_the_newest_checkpoint_and_the_one_resumed_from_stay_even_over_quota(tmp_path: Path,
                                                                            store: CheckpointStore) -> None:
    p = Plane(tmp_path)
    live = job(p, "alice", "preempted")
    f = checkpoints(p, store, live, 100, 100, 100, 100)
    with p.db.tx() as s:
        row = s.get(JobRow, live)
        assert row is not None
        row.resume_from = f[1]
    collector = Collector(p.db, store, Rules(keep=4, quotas=parse_store_quotas("bob=1G,*=50")))
    assert collector.once() == [f[0], f[2]]
    assert kept_in_db(p) == {f[1], f[3]}
    assert kept_in_store(store) == {live: [f[1], f[3]]}
    assert events(p, "store_quota") == [
        (None, "user alice keeps 200 B of checkpoints, over their store quota of 50 B, with only each unfinished "
               "job's newest checkpoint left")]
    assert collector.once() == []
    assert len(events(p, "store_quota")) == 1  # said once, until the user is under quota again
    r = p.http.get("/v1/store/usage", headers=p.as_user())
    assert r.json()["users"] == [{"user": "alice", "jobs": 1, "checkpoints": 2, "bytes": 200, "stored_bytes": 100,
                                  "quota": None}]  # this plane's API was given no quota


def test_the_collector_runs_while_an_agent_writes_a_checkpoint(tmp_path: Path, store: CheckpointStore) -> None:
    """The control plane's pass deletes a finished job's checkpoints and collects their chunks while another
    job's checkpoint is half written, sharing chunks with them; that checkpoint then restores byte for byte."""
    p = Plane(tmp_path)
    done = job(p, "alice", "cancelled", finished_ago=8 * DAY)
    (old,) = checkpoints(p, store, done, 10)
    live = job(p, "alice", "running")
    agent = CheckpointStore(store.url, chunk_size=CHUNK)  # the agent's own handle on the same store
    image = tmp_path / "pages.img"
    content = data(old) + random.Random(7).randbytes(3 * CHUNK)  # the old job's chunks, and new ones
    image.write_bytes(content)
    reached, go = threading.Event(), threading.Event()
    put = agent.backend.put_chunk
    calls: list[int] = []

    def paused(*a: Any) -> int:
        n = put(*a)
        calls.append(n)
        if len(calls) == 1:
            reached.set()
            assert go.wait(60)
        return n

    agent.backend.put_chunk = paused  # type: ignore[method-assign]
    out: list[Any] = []

    def write() -> None:
        try:
            w = agent.writer(live)
            w.add_file("pages.img", image)
            out.append(w.commit({}))
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=write)
    t.start()
    try:
        assert reached.wait(30)
        assert Collector(p.db, store, Rules(keep=3, finished_after=7 * DAY)).once() == [old]
        assert kept_in_store(store) == {live: []}  # the finished job is gone; the live one's is not committed yet
    finally:
        go.set()
        t.join(60)
    (info,) = out
    assert not isinstance(info, BaseException), info
    assert kept_in_store(store) == {live: [info.id]}
    store.verify(live, info.id)
    restored = tmp_path / "restored.img"
    store.reader(live, info.id).extract("pages.img", restored)
    assert restored.read_bytes() == content
    assert chunks(store) == chunks_of(store, {live: [info.id]})
    agent.close()
    p.db.close()


def test_sizes_and_quotas_parse() -> None:
    assert [parse_size(x) for x in ("1024", "1K", "1Ki", "1.5GiB", "2T", "3 MiB")] == [
        1024, 1000, 1024, 3 * 2**29, 2 * 10**12, 3 * 2**20]
    assert parse_store_quotas("alice=2TiB, *=500GiB") == {"alice": 2 * 2**40, "*": 500 * 2**30}
    assert parse_store_quotas(None) == {}
    with pytest.raises(ValidationError, match="bad size 'lots'"):
        parse_store_quotas("alice=lots")
    with pytest.raises(ValidationError, match="expected user=SIZE"):
        parse_store_quotas("2TiB")
