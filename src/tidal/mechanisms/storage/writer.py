"""Writing one checkpoint: chunk, hash, dedup, compress and store files; commit the manifest last."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence, Set
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tidal.errors import CheckpointCorrupt, CheckpointError, StorageError, UndecodableChunk, ValidationError

from .chunks import chunk_key, is_zero, plan, zero_digest
from .manifest import MANIFEST, CheckpointInfo, Entry, Manifest, check_name, file_digest, normalise_meta
from .retry import reading_from
from .sweep import START, overlapping, wait_out

if TYPE_CHECKING:
    from .store import CheckpointStore


class CheckpointWriter:
    """Collects the files of one checkpoint. Nothing is visible to readers until :meth:`commit`.

    Garbage collection may run meanwhile, here or on another machine (:mod:`.sweep`): the chunks this writer
    puts are spared as younger than its start; after each file it records the digests it relies on in a
    pending-refs object under its checkpoint (``pending/NNNNNN.refs``), which GC reads as references; and
    before its commit it checks again the chunks it found already there if a collection overlapped it.
    """

    def __init__(self, store: CheckpointStore, job_id: str, checkpoint_id: str,
                 present: frozenset[str] = frozenset()) -> None:
        """``present``: digests of chunks in the store that the first pending refs already name (those of the
        job's newest committed checkpoint, see ``CheckpointStore.writer``): never asked about."""
        self._store = store
        self.job_id = job_id
        self.id = checkpoint_id
        self._prefix = f"jobs/{job_id}/{checkpoint_id}"
        self._entries: dict[str, Entry] = {}
        self._seen: set[str] = set(present)  # digests present in the store and protected by our pending refs
        self._new: list[str] = []  # chunk keys this writer wrote itself
        # Where each file's bytes can be read again: a local file, the bytes, or (a replica) the source store.
        self._sources: dict[str, Path | bytes | CheckpointStore] = {}
        self._chunk_bytes = 0
        self._refs_seq = 0
        self._state = "open"
        self._mu = threading.Lock()

    # --- context manager: abort unless committed -------------------------------------------------

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._state == "open":
            self.abort()

    # --- adding ------------------------------------------------------------------------------------

    def add_file(
        self,
        name: str,
        path: Path | str,
        *,
        boundaries: Sequence[int] = (),
        mode: int | None = None,
        previous: tuple[Path | str, Entry] | None = None,
        previous_offsets: Mapping[int, int] | None = None,
        digests: Mapping[tuple[int, int], str] | None = None,
    ) -> Entry:
        """Store the file at ``path`` as ``name``; chunks start at every offset in ``boundaries``.

        ``previous``: a local file that was committed earlier as the given entry, unchanged since (the
        last dump of the same process). A chunk whose bytes equal the same range of that file takes its
        known digest instead of being hashed again: a memcmp instead of a sha256 on unchanged memory.
        ``previous_offsets`` maps a chunk's offset in this file to where the same content would sit in the
        previous file (CRIU page files shift when a memory region grows); by default the same offset.
        ``digests``: sha256 of some (offset, length) chunks of this file, computed earlier from bytes that
        have not changed since (see :mod:`tidal.mechanisms.criu.prehash`): such a chunk already in the store
        is not read again."""
        self._check_new(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise CheckpointError(f"cannot read {path} for checkpoint: {e}", object=str(path),
                                  hint="the file must exist and be readable by Tidal") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{path} is not a regular file", object=str(path),
                                      hint="add symbolic links with add_symlink(); other kinds are not stored")
            segments = plan(st.st_size, boundaries, self._store.chunk_size)
            known: dict[tuple[int, int], str] = {}
            prev_fd = -1
            if previous is not None:
                off = 0
                for digest, n in previous[1].chunks:
                    known[(off, n)] = digest
                    off += n
                with contextlib.suppress(OSError):
                    prev_fd = os.open(previous[0], os.O_RDONLY | os.O_CLOEXEC)
            try:
                chunks = self._ingest_file(fd, str(path), segments, known if prev_fd >= 0 else {}, prev_fd,
                                           previous_offsets or {}, digests or {})
            finally:
                if prev_fd >= 0:
                    os.close(prev_fd)
            digest = file_digest(st.st_size, chunks)
        finally:
            os.close(fd)
        self._sources[name] = Path(path)
        return self._add_entry(
            Entry(
                name=name,
                kind="file",
                size=st.st_size,
                mode=stat.S_IMODE(st.st_mode) if mode is None else mode,
                sha256=digest,
                chunks=chunks,
            )
        )

    def add_bytes(self, name: str, data: bytes, *, mode: int = 0o600) -> Entry:
        """Store ``data`` as the file ``name``."""
        self._check_new(name)
        data = bytes(data)
        segments = plan(len(data), (), self._store.chunk_size)
        claimed: set[str] = set()
        futures = [self._store.pool.submit(self._put_chunk, data, off, n, claimed) for off, n in segments]
        chunks = self._collect(futures, claimed)
        digest = file_digest(len(data), chunks)
        self._sources[name] = data
        return self._add_entry(
            Entry(name=name, kind="file", size=len(data), mode=mode, sha256=digest, chunks=chunks)
        )

    def add_symlink(self, name: str, target: str) -> Entry:
        """Record a symbolic link (no chunks)."""
        self._check_new(name)
        raw = target.encode()
        return self._add_entry(
            Entry(
                name=name,
                kind="symlink",
                size=len(raw),
                mode=0o777,
                sha256=hashlib.sha256(raw).hexdigest(),
                target=target,
            )
        )

    def add_copy(self, entry: Entry, source: CheckpointStore,
                 copied: Callable[[int, int], None] | None = None, *, present: Set[str] | None = None) -> Entry:
        """Add ``entry`` of a committed checkpoint in ``source`` (another store): the chunks this store lacks
        are copied as stored (still compressed), each checked against its sha256 on the way; those it holds
        already are not read at all. ``copied(logical, stored)`` is told each copied chunk's size.
        ``present``: digests found in this store since this writer started (not asked again; should one be
        collected before the commit, it is copied again then, see :meth:`_outlast_sweeps`)."""
        self._check_new(name := entry.name)
        if entry.kind == "symlink":
            return self._add_entry(entry)
        sizes = dict(entry.chunks)
        present = set(sizes) & set(present) if present is not None else self.present(set(sizes))
        claimed: set[str] = set()
        futures: list[Future[tuple[str, int]]] = []
        for digest, n in entry.chunks:
            if digest in present:
                futures.append(_known(digest, n))
            else:
                futures.append(self._store.pool.submit(self._copy_chunk, source, name, digest, n, claimed, copied))
        chunks = self._collect(futures, claimed)
        if file_digest(entry.size, chunks) != entry.sha256:
            raise CheckpointError(f"{name}: its chunk list does not match its sha256 in {source.url}",
                                  object=name, hint="the source checkpoint is damaged: replicate an older one")
        self._sources[name] = source
        return self._add_entry(entry)

    def _copy_chunk(self, source: CheckpointStore, name: str, digest: str, n: int, claimed: set[str],
                    copied: Callable[[int, int], None] | None) -> tuple[str, int]:
        """Copy one stored chunk object from ``source``, verified. Runs in the pool."""
        with self._mu:
            if digest in self._seen or digest in claimed:
                return digest, n
            claimed.add(digest)
        key = chunk_key(digest)
        raw = _verified_object(source, name, digest, n)
        written = self._store.backend.put_chunk(key, raw[:1], memoryview(raw)[1:])
        with self._mu:
            self._new.append(key)
            self._chunk_bytes += written
        if copied is not None:
            copied(n, written)
        return digest, n

    def _check_new(self, name: str) -> None:
        if self._state != "open":
            raise CheckpointError(f"checkpoint {self._prefix} is already {self._state}", object=self._prefix)
        check_name(name)
        if name in self._entries:
            raise ValidationError(f"{name!r} is already in checkpoint {self._prefix}", field="name",
                                  hint="a name goes into a checkpoint once")

    def _add_entry(self, entry: Entry) -> Entry:
        self._entries[entry.name] = entry
        return entry

    def _ingest_file(
        self,
        fd: int,
        where: str,
        segments: list[tuple[int, int]],
        known: dict[tuple[int, int], str],
        prev_fd: int,
        moved: Mapping[int, int],
        hashed: Mapping[tuple[int, int], str],
    ) -> tuple[tuple[str, int], ...]:
        store = self._store
        compare = bytearray(store.chunk_size) if known else None
        claimed: set[str] = set()
        futures: list[Future[tuple[str, int]]] = []
        failed = threading.Event()
        try:
            present = self.present({hashed[s] for s in segments if s in hashed})
            for off, n in segments:
                if failed.is_set():
                    break
                digest = hashed.get((off, n))
                if digest is not None and (digest in self._seen or digest in present):
                    futures.append(_known(digest, n))
                    continue
                buf = store.take_buffer()
                try:
                    view = memoryview(buf)[:n]
                    _pread_full(fd, view, off, where)
                except BaseException:
                    store.give_buffer(buf)
                    raise
                view.release()
                prev_off = moved.get(off, off)
                digest = known.get((prev_off, n))
                if digest is not None and compare is not None and _same(prev_fd, prev_off, n, buf, compare):
                    store.give_buffer(buf)
                    futures.append(_known(digest, n))
                    continue
                fut = store.pool.submit(self._put_chunk, buf, 0, n, claimed)
                fut.add_done_callback(_releaser(store, buf, failed))
                futures.append(fut)
        except BaseException:
            _settle(futures)
            raise
        return self._collect(futures, claimed)

    def present(self, digests: set[str]) -> set[str]:
        """Which of these chunks the store holds (or this writer relies on already: the job's newest committed
        checkpoint's, which its first refs protect, are not asked about). The others are asked all at once, in
        the pool: on an object store each question is a request, and most chunks of a periodic checkpoint are
        unchanged."""
        ask = sorted(digests - self._seen)
        if not ask:
            return set(digests)
        backend = self._store.backend
        found = self._store.pool.map(lambda d: backend.exists(chunk_key(d)), ask)
        return {d for d, there in zip(ask, found, strict=True) if there} | (digests & self._seen)

    def _collect(
        self, futures: list[Future[tuple[str, int]]], claimed: set[str]
    ) -> tuple[tuple[str, int], ...]:
        """Wait for every chunk, then record the digests we rely on in pending refs."""
        _settle(futures)
        for f in futures:
            f.result()  # the first failure propagates; _settle made sure nothing is still running
        chunks = tuple(f.result() for f in futures)
        fresh = sorted({h for h, _ in chunks} - self._seen)
        if fresh:
            self._refs_seq += 1
            self._store.backend.put(
                f"{self._prefix}/pending/{self._refs_seq:06d}.refs", "\n".join(fresh).encode(), durable=False
            )
            self._seen.update(fresh)
        return tuple((h, n) for h, n in chunks)

    def _put_chunk(self, base: bytes | bytearray, off: int, n: int, claimed: set[str]) -> tuple[str, int]:
        """Hash one chunk and store it unless the store already has it. Runs in the pool."""
        view = memoryview(base)[off : off + n]
        digest = zero_digest(n) if is_zero(base, off, n) else hashlib.sha256(view).hexdigest()
        with self._mu:
            if digest in self._seen or digest in claimed:
                return digest, n
            claimed.add(digest)
        key = chunk_key(digest)
        backend = self._store.backend
        if backend.exists(key):
            return digest, n
        tag, payload = self._store.codec.encode(view)
        written = backend.put_chunk(key, tag, payload)
        with self._mu:
            self._new.append(key)
            self._chunk_bytes += written
        return digest, n

    # --- ending ------------------------------------------------------------------------------------

    def commit(self, meta: dict[str, Any] | None = None, *, created_at: float | None = None) -> CheckpointInfo:
        """Make the checkpoint exist: chunks are made durable, then the manifest is put atomically.
        ``created_at``: when the checkpoint was taken, if not now (a replica keeps its original's)."""
        if self._state != "open":
            raise CheckpointError(f"checkpoint {self._prefix} is already {self._state}", object=self._prefix)
        store = self._store
        self._outlast_sweeps()
        manifest = Manifest(
            job_id=self.job_id,
            id=self.id,
            created_at=time.time() if created_at is None else created_at,
            chunk_bytes=self._chunk_bytes,
            meta=normalise_meta(meta or {}),
            entries=tuple(self._entries.values()),
        )
        data = manifest.encode()
        store.backend.make_durable(self._new, store.pool)
        store.backend.put(f"{self._prefix}/{MANIFEST}", data)
        self._state = "committed"
        # Only now may the pending refs go: GC reads pending refs before manifests.
        # Leftovers would be harmless: they only keep chunks alive until the checkpoint is deleted.
        with contextlib.suppress(StorageError):
            store.backend.delete_tree(f"{self._prefix}/pending")
        return manifest.info(len(data))

    def _outlast_sweeps(self) -> None:
        """If a garbage collection overlapped this writer, wait until it is over, then put again any chunk this
        writer relies on without having written it that is gone (see :mod:`.sweep`)."""
        backend = self._store.backend
        started = backend.modified(f"{self._prefix}/pending/{START}")
        if started is None:
            raise CheckpointError(f"checkpoint {self._prefix} was removed while it was being written",
                                  object=self._prefix, hint="take the checkpoint again")
        sweeps = overlapping(backend, started)
        if not sweeps:
            return
        wait_out(backend, sweeps)
        written = {k.rsplit("/", 1)[-1] for k in self._new}
        relied = sorted({h for e in self._entries.values() for h, _ in e.chunks} - written)
        there = self._store.pool.map(lambda d: backend.exists(chunk_key(d)), relied)
        gone = {d for d, ok in zip(relied, there, strict=True) if not ok}
        for name, entry in self._entries.items():
            off = 0
            for h, n in entry.chunks:
                if h in gone:
                    self._put_again(name, h, off, n)
                    gone.discard(h)
                off += n

    def _put_again(self, name: str, digest: str, off: int, n: int) -> None:
        source = self._sources.get(name)
        data = b""
        if source is not None and not isinstance(source, bytes | Path):  # a replica's: copy it again
            raw = _verified_object(source, name, digest, n)
            written = self._store.backend.put_chunk(chunk_key(digest), raw[:1], memoryview(raw)[1:])
            self._new.append(chunk_key(digest))
            self._chunk_bytes += written
            return
        if isinstance(source, bytes):
            data = source[off : off + n]
        elif source is not None:
            with contextlib.suppress(OSError), open(source, "rb") as f:
                f.seek(off)
                data = f.read(n)
        if len(data) != n or (zero_digest(n) if is_zero(data, 0, n) else hashlib.sha256(data).hexdigest()) != digest:
            raise CheckpointError(
                f"chunk {digest} of {name} in checkpoint {self._prefix} was collected while the checkpoint was "
                "written, and the file changed since", object=chunk_key(digest), hint="take the checkpoint again")
        tag, payload = self._store.codec.encode(memoryview(data))
        key = chunk_key(digest)
        written = self._store.backend.put_chunk(key, tag, payload)
        self._new.append(key)
        self._chunk_bytes += written

    def abort(self) -> None:
        """Forget this checkpoint and remove the chunks only it wrote. Idempotent; no-op once committed."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._store._discard(self._prefix, self._new)

    @property
    def state(self) -> str:
        return self._state


def _verified_object(source: CheckpointStore, name: str, digest: str, n: int) -> bytes:
    """A chunk object of ``source`` as stored, once its content is checked against ``digest``."""
    key = chunk_key(digest)
    try:
        with reading_from(source.url):
            raw = source.backend.get(key)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{name}: chunk {digest} is missing from {source.url}", object=name, chunk=digest,
                                reason="missing") from None
    try:
        data = source.codec.decode(raw, n)
    except UndecodableChunk as e:
        raise CheckpointCorrupt(f"{name}: chunk {digest} in {source.url} is {e.message}", object=name,
                                chunk=digest, reason=e.fields["reason"]) from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointCorrupt(f"{name}: chunk {digest} in {source.url} is corrupt (sha256 mismatch)", object=name,
                                chunk=digest, reason="sha256 mismatch")
    return raw


def _known(digest: str, n: int) -> Future[tuple[str, int]]:
    """A chunk whose digest is known without hashing, as the result the pool's chunks give."""
    done: Future[tuple[str, int]] = Future()
    done.set_result((digest, n))
    return done


def _same(prev_fd: int, off: int, n: int, buf: bytearray, compare: bytearray) -> bool:
    """Whether ``buf[:n]`` equals bytes ``off..off+n`` of the previous file (startswith is a memcmp)."""
    view = memoryview(compare)[:n]
    try:
        got = os.preadv(prev_fd, [view], off)
        return got == n and buf.startswith(view)
    except OSError:
        return False
    finally:
        view.release()


def _pread_full(fd: int, view: memoryview, off: int, where: str) -> None:
    got = 0
    n = len(view)
    while got < n:
        k = os.preadv(fd, [view[got:]], off + got)
        if k == 0:
            raise CheckpointError(f"{where} shrank while it was being stored", object=where,
                                  hint="a file must not change while a checkpoint of it is taken")
        got += k


def _releaser(
    store: CheckpointStore, buf: bytearray, failed: threading.Event
) -> Callable[[Future[Any]], None]:
    """Done-callback: hand the read buffer back and flag a failure so the reader stops early."""

    def done(f: Future[Any]) -> None:
        store.give_buffer(buf)
        if not f.cancelled() and f.exception() is not None:
            failed.set()

    return done


def _settle(futures: list[Future[Any]]) -> None:
    """Wait until no future is running; cancel the queued ones once one has failed."""
    pending = deque(futures)
    while pending:
        f = pending.popleft()
        try:
            f.result()
        except BaseException:
            for g in pending:
                g.cancel()
            for g in pending:
                if not g.cancelled():
                    g.exception()
            return
