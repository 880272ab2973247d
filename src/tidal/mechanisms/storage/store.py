"""The checkpoint store: jobs, their committed checkpoints, retention and chunk garbage collection.

Layout under the root (a local directory or an fsspec URL)::

    chunks/<2 hex>/<sha256>                 one chunk (tag byte + raw or zstd payload), shared by all
    jobs/<job>/<checkpoint>/manifest.json   present exactly when the checkpoint is committed
    jobs/<job>/<checkpoint>/pending/start   an in-progress writer's start (the time it was written)
    jobs/<job>/<checkpoint>/pending/*.refs  digests an in-progress writer relies on
    sweeps/<id>.json                        garbage collections running or recently ended (:mod:`.sweep`)
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from tidal.config import Settings, load_settings
from tidal.errors import CheckpointCorrupt, CheckpointError, StorageError, ValidationError

from .backends import Backend, LocalBackend, open_backend
from .chunks import Codec, check_chunk_size
from .manifest import (
    MANIFEST,
    CheckpointInfo,
    Manifest,
    check_id,
    new_checkpoint_id,
    sequence_of,
    sort_key,
)
from .reader import CheckpointReader
from .sweep import START, Sweep, prune
from .writer import CheckpointWriter

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 1 << 20


class CheckpointStore:
    """Content-addressed, compressed, verified checkpoint storage for many jobs."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        level: int = 1,
        workers: int | None = None,
        gc_grace: float | None = None,
        sweep_limit: float = 300.0,
        writer_lease: float = 3600.0,
        **storage_options: Any,
    ) -> None:
        """``storage_options`` go to the backend (for ``s3://``: :class:`~.s3.S3Backend`'s). Garbage collection
        (:mod:`.sweep`) spares chunks written less than ``gc_grace`` seconds before the oldest live writer
        started (default: the backend's own, a minute on S3, none on a local directory), deletes for at most
        ``sweep_limit`` seconds per run, and takes a writer that wrote nothing under its pending refs for
        ``writer_lease`` seconds for dead."""
        check_chunk_size(chunk_size)
        self.backend: Backend = open_backend(url, **storage_options)
        self.gc_grace = float(getattr(self.backend, "gc_grace", 0.0) if gc_grace is None else gc_grace)
        self.sweep_limit = sweep_limit
        self.writer_lease = writer_lease
        self.url = self.backend.url
        self.chunk_size = chunk_size
        self.codec = Codec(level)
        if workers is None:
            # Local work is CPU-bound (sha256, zstd); remote work waits on the network.
            workers = (os.cpu_count() or 2) if isinstance(self.backend, LocalBackend) else 16
        self.workers = max(1, workers)
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="tidal-store")
        # Reusable read buffers bound the memory a writer holds: a few chunks per worker.
        self._buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._max_buffers = 2 * self.workers + 2
        self._made_buffers = 0
        self._buffers_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.backend.close()

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- buffers for writers ---------------------------------------------------------------------

    def take_buffer(self) -> bytearray:
        try:
            return self._buffers.get_nowait()
        except queue.Empty:
            pass
        with self._buffers_lock:
            if self._made_buffers < self._max_buffers:
                self._made_buffers += 1
                return bytearray(self.chunk_size)
        return self._buffers.get()

    def give_buffer(self, buf: bytearray) -> None:
        self._buffers.put(buf)

    # --- checkpoints -------------------------------------------------------------------------------

    def writer(self, job_id: str, checkpoint_id: str | None = None) -> CheckpointWriter:
        """Start a checkpoint of ``job_id``; its id defaults to the next sequence number + a suffix."""
        check_id("job id", job_id)
        if checkpoint_id is None:
            seq = 1 + max((sequence_of(c) for c in self.backend.listdir(f"jobs/{job_id}")), default=0)
            checkpoint_id = new_checkpoint_id(seq)
        else:
            check_id("checkpoint id", checkpoint_id)
        prefix = f"jobs/{job_id}/{checkpoint_id}"
        if self.backend.listdir(prefix) or not self.backend.mkdir(prefix):
            raise CheckpointError(f"checkpoint {job_id}/{checkpoint_id} already exists", object=prefix,
                                  hint="give the new checkpoint another id, or none for a fresh one")
        # The start marker makes the checkpoint in progress (object stores have no directories) and its time
        # the writer's start (see .sweep). The first refs then name the chunks of the job's newest committed
        # checkpoint, read after it: they are kept while this writer runs, and it never asks about them.
        self.backend.put(f"{prefix}/pending/{START}", b"", durable=False)
        present = self._newest_chunks(job_id, checkpoint_id)
        self.backend.put(f"{prefix}/pending/000000.refs", "\n".join(sorted(present)).encode(), durable=False)
        return CheckpointWriter(self, job_id, checkpoint_id, present=present)

    def _newest_chunks(self, job_id: str, checkpoint_id: str) -> frozenset[str]:
        """On an object store, the chunks of the job's newest committed checkpoint (asking whether a chunk is
        there is a request each, and most chunks of a periodic checkpoint are unchanged). A local directory
        answers such questions with a stat: none."""
        if isinstance(self.backend, LocalBackend):
            return frozenset()
        others = [c for c in self.backend.listdir(f"jobs/{job_id}") if c != checkpoint_id and not c.startswith(".")]
        for cid in sorted(others, key=sort_key, reverse=True):
            try:
                return frozenset(self._load(job_id, cid)[0].chunk_digests())
            except CheckpointError:
                continue  # not committed (in progress, aborted) or damaged: the one before
        return frozenset()

    def _load(self, job_id: str, checkpoint_id: str) -> tuple[Manifest, int]:
        key = f"jobs/{job_id}/{checkpoint_id}/{MANIFEST}"
        try:
            raw = self.backend.get(key)
        except FileNotFoundError:
            # Not a verification failure: an id never committed, or a store that is not the one written to.
            raise CheckpointError(
                f"checkpoint {job_id}/{checkpoint_id} does not exist or was never committed (no manifest)",
                object=key,
                reason="missing",
            ) from None
        try:
            m = Manifest.decode(raw, key)
        except CheckpointCorrupt as e:
            e.fields["checkpoint"] = checkpoint_id
            raise
        if (m.job_id, m.id) != (job_id, checkpoint_id):
            raise CheckpointCorrupt(
                f"manifest {key} belongs to checkpoint {m.job_id}/{m.id}",
                checkpoint=checkpoint_id,
                object=key,
                reason="misplaced",
            )
        return m, len(raw)

    def list(self, job_id: str) -> list[CheckpointInfo]:
        """Committed checkpoints of ``job_id``, oldest first. Unreadable manifests are skipped (logged)."""
        check_id("job id", job_id)
        out = []
        for cid in sorted(self.backend.listdir(f"jobs/{job_id}"), key=sort_key):
            if cid.startswith("."):
                continue
            try:
                m, size = self._load(job_id, cid)
            except CheckpointError as e:
                if e.fields.get("reason") != "missing":
                    log.warning("skipping checkpoint %s/%s: %s", job_id, cid, e)
                continue
            out.append(m.info(size))
        return out

    def latest(self, job_id: str) -> CheckpointInfo | None:
        infos = self.list(job_id)
        return infos[-1] if infos else None

    def reader(self, job_id: str, checkpoint_id: str) -> CheckpointReader:
        check_id("job id", job_id)
        check_id("checkpoint id", checkpoint_id)
        m, size = self._load(job_id, checkpoint_id)
        return CheckpointReader(self, m, size)

    def verify(self, job_id: str, checkpoint_id: str) -> None:
        """Read and check every object of a checkpoint; CheckpointError names the first bad one."""
        self.reader(job_id, checkpoint_id).verify()

    # --- deletion and garbage collection ----------------------------------------------------------

    def retain(self, job_id: str, keep: int) -> builtins.list[str]:
        """Delete all but the newest ``keep`` committed checkpoints of the job, then collect garbage."""
        if keep < 0:
            raise ValidationError(f"keep must be >= 0, not {keep}", field="keep",
                                  hint="the number of newest committed checkpoints to keep")
        infos = self.list(job_id)
        doomed = infos[: max(0, len(infos) - keep)]
        for info in doomed:
            self._delete_checkpoint(job_id, info.id)
        self.gc()
        return [i.id for i in doomed]

    def keep_only(self, job_id: str, keep: set[str]) -> builtins.list[str]:
        """Delete the job's committed checkpoints whose ids are not in ``keep``, then collect garbage."""
        doomed = [i.id for i in self.list(job_id) if i.id not in keep]
        for cid in doomed:
            self._delete_checkpoint(job_id, cid)
        if doomed:
            self.gc()
        return doomed

    def delete(self, job_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (committed or not; nothing if absent). Its chunks go at the next :meth:`gc`."""
        check_id("job id", job_id)
        check_id("checkpoint id", checkpoint_id)
        self._delete_checkpoint(job_id, checkpoint_id)

    def delete_job(self, job_id: str, *, collect: bool = True) -> None:
        """Delete every checkpoint of the job (do not call while the job is being checkpointed), then collect
        garbage (``collect``)."""
        check_id("job id", job_id)
        for cid in self.backend.listdir(f"jobs/{job_id}"):
            self._delete_checkpoint(job_id, cid)
        self.backend.delete_tree(f"jobs/{job_id}")
        if collect:
            self.gc()

    def _delete_checkpoint(self, job_id: str, checkpoint_id: str) -> None:
        prefix = f"jobs/{job_id}/{checkpoint_id}"
        self.backend.delete(f"{prefix}/{MANIFEST}")  # un-commit first, atomically
        self.backend.delete_tree(prefix)

    def gc(self) -> int:
        """Remove chunks that no manifest and no writer in progress references, safely while checkpoints are
        being written here or on other machines (:mod:`.sweep`); return how many were removed."""
        return self._sweep(None)

    def _discard(self, prefix: str, new_keys: Iterable[str]) -> None:
        """Drop an uncommitted checkpoint and the chunks it wrote that nothing else references."""
        self.backend.delete_tree(prefix)
        keys = list(new_keys)
        if not keys:
            return
        try:
            self._sweep(keys)
        except StorageError as e:
            if e.fields.get("reason") != "store full":
                raise
            # No room even for the collection's marker: free the space without it (a writer elsewhere that
            # found one of these chunks in the last moments may then lose it; its restore falls back).
            live, _ = self._scan(time.time())
            for key in keys:
                if key.rsplit("/", 1)[-1] not in live:
                    self.backend.delete(key)

    def _sweep(self, only: builtins.list[str] | None) -> int:
        """Collect the unreferenced chunks among ``only`` (None: every chunk). See :mod:`.sweep`."""
        b = self.backend
        with Sweep(b, self.sweep_limit) as sweep:
            started = time.time()  # before anything is looked at: a writer starting later starts after it
            live, starts = self._scan(started)
            oldest = min([started, *starts])
            watermark = oldest - self.gc_grace
            candidates = b.chunks() if only is None else ((k, None) for k in only)
            removed = 0
            for key, modified in candidates:
                name = key.rsplit("/", 1)[-1]
                temp = name.startswith(".")  # a put in progress, or a crash's leftover: old enough, the latter
                if not temp and name in live:
                    continue
                when = b.modified(key) if modified is None else modified
                if when is None or when >= watermark:
                    continue  # gone, or written since the oldest writer in progress started
                if not sweep.may_delete():
                    log.info("garbage collection stopped at its deadline; the next one goes on")
                    break
                b.delete(key)
                removed += not temp
            prune(b, oldest, sweep.key)
            return removed

    def _scan(self, now: float) -> tuple[set[str], builtins.list[float]]:
        """Digests referenced by any pending writer or any manifest, and the start (store time) of every
        live writer (a checkpoint without manifest whose pending objects were written within the lease).

        Per checkpoint, pending refs are read before the manifest: a writer puts its manifest before it
        deletes its pending refs, so a checkpoint committing meanwhile is seen one way or the other.
        """
        live: set[str] = set()
        starts: builtins.list[float] = []
        b = self.backend
        for job in b.listdir("jobs"):
            for cid in b.listdir(f"jobs/{job}"):
                prefix = f"jobs/{job}/{cid}"
                pending = b.listdir(f"{prefix}/pending")
                for ref in pending:
                    if ref.endswith(".refs"):
                        with contextlib.suppress(FileNotFoundError):
                            live.update(b.get(f"{prefix}/pending/{ref}").decode().split())
                try:
                    raw = b.get(f"{prefix}/{MANIFEST}")
                except FileNotFoundError:
                    times = [t for t in (b.modified(f"{prefix}/pending/{p}") for p in pending) if t is not None]
                    if times and max(times) > now - self.writer_lease:
                        starts.append(min(times))
                    continue
                live.update(_manifest_digests(raw, f"{prefix}/{MANIFEST}"))
        return live, starts


def open_store(settings: Settings | None = None, **kw: Any) -> CheckpointStore:
    """The checkpoint store the settings name: ``TIDAL_CHECKPOINT_STORE`` and, for S3, ``TIDAL_STORE_*``."""
    s = settings or load_settings()
    return CheckpointStore(s.store_url, **{"workers": s.store_concurrency, **store_options(s), **kw})


def store_options(s: Settings, url: str | None = None) -> dict[str, Any]:
    """The backend options of the settings' store, or of the store at ``url`` (none for a local directory)."""
    url = url or s.store_url
    if "://" not in url or url.startswith("file://"):
        return {}
    if not url.startswith(("s3://", "s3a://")):
        return {"retry": s.store_retries}
    secret = s.store_secret_access_key.get_secret_value() if s.store_secret_access_key else None
    given = {
        "endpoint_url": s.store_endpoint_url, "key": s.store_access_key_id, "secret": secret,
        "region": s.store_region, "profile": s.store_profile, "addressing_style": s.store_addressing_style,
        "sse": s.store_sse, "sse_kms_key_id": s.store_sse_kms_key_id,
    }
    return {**{k: v for k, v in given.items() if v is not None}, "retry": s.store_retries, "timeout": s.store_timeout}


def _manifest_digests(raw: bytes, where: str) -> set[str]:
    """Chunk digests named by a manifest; lenient, so that a damaged manifest still protects its chunks."""
    try:
        body = json.loads(raw)
        return {str(c[0]) for e in body.get("entries", ()) for c in e.get("chunks", ())}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        log.warning("garbage collection cannot read %s; its chunks are unprotected", where)
        return set()
