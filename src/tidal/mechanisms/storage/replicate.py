"""Copying a committed checkpoint from one store to another (a region's to another region's).

Only the chunks the target lacks cross: content addressing makes "lacks" exact, so replicating the job's
newest checkpoint ahead of a move (pre-copy) leaves, for the move itself, only what changed since. Each copied
chunk is checked against its sha256 on the way and written as stored (compressed); the replica is committed
under the same checkpoint id with the original's time and meta, under the target's garbage-collection
protocol (pending refs, sweeps outlasted) like any writer's checkpoint. A source that does not answer is told
apart from a damaged source: :class:`~tidal.errors.StoreUnreachable` (naming it), not
:class:`~tidal.errors.CheckpointCorrupt`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidal.errors import CheckpointError, StorageError

from .manifest import MANIFEST
from .retry import reading_from
from .store import CheckpointStore
from .sweep import START

log = logging.getLogger(__name__)

ALIVE = "alive"


@dataclass(frozen=True)
class Replicated:
    """What a replication did. ``copied_bytes``: stored (compressed) bytes that crossed to the target;
    ``logical_bytes``: the checkpoint's size; ``missing_bytes``: the logical size of the chunks copied."""

    job_id: str
    checkpoint_id: str
    chunks: int
    copied_chunks: int
    logical_bytes: int
    missing_bytes: int
    copied_bytes: int
    seconds: float
    already_there: bool = False


#: ``progress(done, total)``: logical bytes of missing chunks copied so far, of how many to copy in all.
Progress = Callable[[int, int], None]


#: A replica in progress shows it is alive this often; one silent for STALE_S is taken for dead.
ALIVE_EVERY_S = 5.0
STALE_S = 60.0


def replicate(source: CheckpointStore, target: CheckpointStore, job_id: str, checkpoint_id: str,
              progress: Progress | None = None, *, stale_s: float = STALE_S) -> Replicated:
    """Make ``checkpoint_id`` of ``job_id`` committed in ``target`` as it is in ``source``. Idempotent: a
    replica committed already is left alone. A replication that fails removes what it copied (the writer's
    abort); one whose process died leaves a half-written replica, started again here once it has been silent
    for ``stale_s``, and the chunks it had copied are found in the target and not copied twice. Another
    replication of the same checkpoint under way (the other nodes of a restore in the same region) is waited
    for, not raced."""
    t0 = time.monotonic()
    with reading_from(source.url):
        manifest, _ = source._load(job_id, checkpoint_id)
    logical = sum(e.size for e in manifest.entries if e.kind == "file")
    unique = {h: n for e in manifest.entries for h, n in e.chunks}

    def already() -> Replicated:
        return Replicated(job_id, checkpoint_id, len(unique), 0, logical, 0, 0, time.monotonic() - t0,
                          already_there=True)

    with contextlib.suppress(CheckpointError):
        there, _ = target._load(job_id, checkpoint_id)
        if there.entries == manifest.entries:
            return already()
        raise CheckpointError(f"checkpoint {job_id}/{checkpoint_id} in {target.url} differs from the one in "
                              f"{source.url}", object=f"jobs/{job_id}/{checkpoint_id}",
                              hint="delete the target's copy (tidal store) and replicate again")
    deadline = time.monotonic() + stale_s
    while True:
        if _await_other(target, job_id, checkpoint_id, stale_s):
            return already()
        try:
            writer = target.writer(job_id, checkpoint_id)
            break
        except CheckpointError:
            # Another replication began between our look and our start (its directory is there, its start
            # marker not yet): look again, and wait for it.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    # The chunks of the job's newest checkpoint in the target (a pre-copy's replica) are known to be there;
    # only the others are asked about, in the pool: on an object store each question is a request.
    present = writer.present(set(unique))
    total = sum(n for h, n in unique.items() if h not in present)
    mu = threading.Lock()
    done = [0, 0, 0]  # logical bytes, stored bytes, chunks

    def copied(n: int, stored: int) -> None:
        with mu:
            done[0] += n
            done[1] += stored
            done[2] += 1
            now = done[0]
        if progress is not None:
            progress(now, total)

    if progress is not None:
        progress(0, total)
    stop = threading.Event()
    alive = threading.Thread(target=_keep_alive, args=(target, f"jobs/{job_id}/{checkpoint_id}", stop),
                             name="tidal-replica-alive", daemon=True)
    with writer:
        alive.start()
        try:
            for entry in manifest.entries:
                writer.add_copy(entry, source, copied, present=present)
            writer.commit(manifest.meta, created_at=manifest.created_at)
        finally:
            stop.set()
            alive.join()
    return Replicated(job_id, checkpoint_id, len(unique), done[2], logical, done[0], done[1],
                      time.monotonic() - t0)


def _await_other(target: CheckpointStore, job_id: str, checkpoint_id: str, stale_s: float) -> bool:
    """Wait out another replica of the checkpoint in progress: True once it is committed; False when there
    is none, or it fell silent (its process died: what it left is removed, its chunks stay)."""
    prefix = f"jobs/{job_id}/{checkpoint_id}"
    backend = target.backend
    while backend.listdir(prefix):
        if backend.exists(f"{prefix}/{MANIFEST}"):
            return True
        # Its start marker, what it last said of itself, and (a local store's) directories, which change as
        # it writes: a replication that is only beginning has the latter.
        marks = [m for m in (backend.modified(f"{prefix}/pending/{START}"),
                             backend.modified(f"{prefix}/pending/{ALIVE}"), backend.modified(f"{prefix}/pending"),
                             backend.modified(prefix)) if m is not None]
        if not marks or time.time() - max(marks) > stale_s:
            log.info("replica %s in %s was left by a replication that died: starting it again", prefix, target.url)
            backend.delete_tree(prefix)
            return False
        time.sleep(min(1.0, stale_s / 10))
    return False


def _keep_alive(target: CheckpointStore, prefix: str, stop: threading.Event) -> None:
    while not stop.wait(ALIVE_EVERY_S):
        with contextlib.suppress(StorageError):
            target.backend.put(f"{prefix}/pending/{ALIVE}", b"", durable=False)
