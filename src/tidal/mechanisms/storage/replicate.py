"""Copying a committed checkpoint from one store to another (a region's to another region's).

Only the chunks the target lacks cross: content addressing makes "lacks" exact, so replicating the job's
newest checkpoint ahead of a move (pre-copy) leaves, for the move itself, only what changed since. Each copied
chunk is checked against its sha256 on the way and written as stored (compressed); the replica is committed
under the same checkpoint id with the original's time and meta, under the target's garbage-collection
protocol (pending refs, sweeps outlasted) like any writer's checkpoint.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidal.errors import CheckpointError

from .chunks import chunk_key
from .manifest import MANIFEST
from .store import CheckpointStore


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


def replicate(source: CheckpointStore, target: CheckpointStore, job_id: str, checkpoint_id: str,
              progress: Progress | None = None) -> Replicated:
    """Make ``checkpoint_id`` of ``job_id`` committed in ``target`` as it is in ``source``. Idempotent: a
    replica committed already is left alone. A replication that fails removes what it copied (the writer's
    abort); one whose process died leaves a half-written replica, started again here, and the chunks it had
    copied are found in the target and not copied twice."""
    t0 = time.monotonic()
    manifest, _ = source._load(job_id, checkpoint_id)
    logical = sum(e.size for e in manifest.entries if e.kind == "file")
    unique = {h: n for e in manifest.entries for h, n in e.chunks}
    with contextlib.suppress(CheckpointError):
        there, _ = target._load(job_id, checkpoint_id)
        if there.entries == manifest.entries:
            return Replicated(job_id, checkpoint_id, len(unique), 0, logical, 0, 0, time.monotonic() - t0,
                              already_there=True)
        raise CheckpointError(f"checkpoint {job_id}/{checkpoint_id} in {target.url} differs from the one in "
                              f"{source.url}", object=f"jobs/{job_id}/{checkpoint_id}",
                              hint="delete the target's copy (tidal store) and replicate again")
    prefix = f"jobs/{job_id}/{checkpoint_id}"
    if target.backend.listdir(prefix) and not target.backend.exists(f"{prefix}/{MANIFEST}"):
        target.backend.delete_tree(prefix)  # a replica cut short: its chunks stay, found present below
    present = {h for h in unique if target.backend.exists(chunk_key(h))}
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
    with target.writer(job_id, checkpoint_id) as writer:
        for entry in manifest.entries:
            writer.add_copy(entry, source, copied)
        writer.commit(manifest.meta, created_at=manifest.created_at)
    return Replicated(job_id, checkpoint_id, len(unique), done[2], logical, done[0], done[1],
                      time.monotonic() - t0)
