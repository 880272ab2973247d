"""Reading one committed checkpoint back, verifying every chunk and every file's sha256."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.errors import CheckpointError

from .chunks import chunk_key, zero_digest
from .manifest import CheckpointInfo, Entry, Manifest, file_digest

if TYPE_CHECKING:
    from .store import CheckpointStore


class _Sink:
    """Where a file's verified bytes go. Chunk writes come from pool threads, at their own offsets."""

    def open(self, entry: Entry) -> None: ...

    def write(self, off: int, data: bytes | memoryview) -> None: ...

    def finish(self) -> None: ...

    def fail(self) -> None: ...


class _FileSink(_Sink):
    """Writes to a temp file beside ``dest`` and renames it over ``dest`` once verified."""

    def __init__(self, dest: Path) -> None:
        self.dest = Path(dest)
        self.tmp = self.dest.parent / f".{self.dest.name}.{secrets.token_hex(4)}.tidal-tmp"
        self.fd = -1
        self.entry: Entry | None = None

    def _error(self, e: OSError) -> CheckpointError:
        return CheckpointError(f"cannot restore {self.dest}: {e}", object=str(self.dest))

    def open(self, entry: Entry) -> None:
        self.entry = entry
        try:
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            if entry.kind == "symlink":
                assert entry.target is not None
                os.symlink(entry.target, self.tmp)
                return
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.ftruncate(self.fd, entry.size)  # zero chunks are then left as holes
        except OSError as e:
            raise self._error(e) from None

    def write(self, off: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        try:
            while view:
                k = os.pwrite(self.fd, view, off)
                view, off = view[k:], off + k
        except OSError as e:
            raise self._error(e) from None

    def finish(self) -> None:
        assert self.entry is not None
        try:
            if self.fd >= 0:
                os.fchmod(self.fd, self.entry.mode)
                os.close(self.fd)
                self.fd = -1
            os.replace(self.tmp, self.dest)
        except OSError as e:
            self.fail()
            raise self._error(e) from None

    def fail(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class _BytesSink(_Sink):
    def __init__(self) -> None:
        self.buf = bytearray()

    def open(self, entry: Entry) -> None:
        self.buf = bytearray(entry.size)

    def write(self, off: int, data: bytes | memoryview) -> None:
        self.buf[off : off + len(data)] = data


class CheckpointReader:
    """A committed checkpoint: its manifest, and verified access to its files."""

    def __init__(self, store: CheckpointStore, manifest: Manifest, manifest_bytes: int) -> None:
        self._store = store
        self._manifest = manifest
        self._entries = {e.name: e for e in manifest.entries}
        self.info: CheckpointInfo = manifest.info(manifest_bytes)

    @property
    def meta(self) -> dict[str, Any]:
        return self._manifest.meta

    def names(self) -> list[str]:
        return [e.name for e in self._manifest.entries]

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(
                f"{name!r} is not in checkpoint {self.info.job_id}/{self.info.id}", object=name
            ) from None

    def extract(self, name: str, dest: Path | str) -> None:
        """Write file ``name`` to ``dest`` (temp file + rename) after verifying it."""
        self.extract_all([(name, Path(dest))])

    def extract_all(
        self, pairs: Iterable[tuple[str, Path | str]], *, bases: Mapping[str, tuple[Path, Entry]] | None = None
    ) -> None:
        """Extract many files; their chunks are fetched and verified in parallel.

        ``bases``: for some names, a local file that holds the content of an earlier entry and was verified
        when it was put there (a pre-staged earlier checkpoint). Chunks it holds (same digest, wherever they
        sit in it) are copied from it; only the others are fetched from the store and verified."""
        bases = bases or {}
        items: list[tuple[Entry, _Sink]] = []
        local: list[tuple[Path, dict[str, int]] | None] = []
        for n, d in pairs:
            entry = self.entry(n)
            items.append((entry, _FileSink(Path(d))))
            base = bases.get(n)
            local.append((base[0], {h: off for off, _, h in _placed(base[1].chunks)}) if base else None)
        self._run(items, fetch_zero=False, local=local)

    def read_bytes(self, name: str) -> bytes:
        entry = self.entry(name)
        if entry.kind != "file":
            raise CheckpointError(f"{name!r} is a {entry.kind}, not a file", object=name)
        sink = _BytesSink()
        self._run([(entry, sink)], fetch_zero=False)
        return bytes(sink.buf)

    def verify(self) -> None:
        """Read every object of the checkpoint; raise CheckpointError on the first bad one."""
        self._run([(e, _Sink()) for e in self._manifest.entries], fetch_zero=True)

    def _run(
        self,
        items: list[tuple[Entry, _Sink]],
        *,
        fetch_zero: bool,
        local: list[tuple[Path, dict[str, int]] | None] | None = None,
    ) -> None:
        """Fetch, check and deliver chunks with a bounded window of work in the pool.

        The whole-file sha256 is computed here, in file order, while pool threads verify chunks. Each
        task reads its chunk object into a buffer from a small pool owned by this call (fresh memory
        is costly to fault in, and pool threads must never wait for a buffer).
        """
        store = self._store
        free = [bytearray(store.chunk_size + 1) for _ in range(2 * store.workers + 2)]
        window: deque[_Slot] = deque()
        opened: list[_State] = []
        base_fds: list[int] = []
        try:
            for i, (entry, sink) in enumerate(items):
                here = local[i] if local else None
                base_fd, base_at = (-1, {}) if here is None else (_open_base(here[0]), here[1])
                if base_fd >= 0:
                    base_fds.append(base_fd)
                st = _State(entry, sink)
                sink.open(entry)
                opened.append(st)
                if entry.kind == "symlink":
                    st.hash.update((entry.target or "").encode())
                off = 0
                for digest, n in entry.chunks:
                    while not free:
                        _drain_one(window, free)
                    buf = free.pop()
                    from_base = base_at.get(digest) if base_fd >= 0 and digest != zero_digest(n) else None
                    if from_base is not None:
                        fut = store.pool.submit(_copy_local, base_fd, from_base, n, sink, off, buf)
                    else:
                        fut = store.pool.submit(self._fetch, entry, digest, n, sink, off, fetch_zero, buf)
                    window.append((st, fut, n, buf))
                    off += n
                window.append((st, None, 0, None))
            while window:
                _drain_one(window, free)
        except BaseException:
            for _, f, _, _ in window:
                if f is not None:
                    f.cancel()
            for _, f, _, _ in window:
                if f is not None and not f.cancelled():
                    f.exception()
            for st in opened:
                if not st.done:
                    st.sink.fail()
            raise
        finally:
            for fd in base_fds:
                os.close(fd)

    def _fetch(
        self, entry: Entry, digest: str, n: int, sink: _Sink, off: int, fetch_zero: bool, buf: bytearray
    ) -> bytes | memoryview | None:
        if not fetch_zero and digest == zero_digest(n):
            return None  # content is known from the digest; the sink already holds zeros
        store = self._store
        key = chunk_key(digest)
        where = f"{self.info.job_id}/{self.info.id}"
        try:
            raw = store.backend.get_into(key, buf)
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {where}: file {entry.name!r}: chunk {digest} is missing from the store ({key})",
                object=entry.name,
                chunk=digest,
                reason="missing",
            ) from None
        try:
            data = store.codec.decode(raw, n)
        except ValueError as e:
            raise CheckpointError(
                f"checkpoint {where}: file {entry.name!r}: chunk {digest} is {e}",
                object=entry.name,
                chunk=digest,
                reason=str(e).split(":")[0].split(" (")[0],
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CheckpointError(
                f"checkpoint {where}: file {entry.name!r}: chunk {digest} is corrupt (sha256 mismatch)",
                object=entry.name,
                chunk=digest,
                reason="sha256 mismatch",
            )
        sink.write(off, data)
        return data


class _State:
    def __init__(self, entry: Entry, sink: _Sink) -> None:
        self.entry = entry
        self.sink = sink
        self.hash = hashlib.sha256()
        self.done = False


_Slot = tuple[_State, "Future[bytes | memoryview | None] | None", int, "bytearray | None"]


def _drain_one(window: deque[_Slot], free: list[bytearray]) -> None:
    """Finish the oldest slot: wait for its chunk, or check the file's digest and close it."""
    st, fut, _, buf = window.popleft()
    if fut is None:
        e = st.entry
        want = st.hash.hexdigest() if e.kind == "symlink" else file_digest(e.size, e.chunks)
        if want != e.sha256:
            raise CheckpointError(
                f"file {st.entry.name!r}: its chunk list does not match its sha256 (damaged manifest entry)",
                object=st.entry.name,
                reason="sha256 mismatch",
            )
        st.sink.finish()
        st.done = True
        return
    try:
        fut.result()  # each chunk was checked against its own sha256 in the pool
    finally:
        if buf is not None:
            free.append(buf)


def _placed(chunks: tuple[tuple[str, int], ...]) -> list[tuple[int, int, str]]:
    """(offset, length, digest) of every chunk of a file."""
    out, off = [], 0
    for digest, n in chunks:
        out.append((off, n, digest))
        off += n
    return out


def _open_base(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1  # gone: everything is fetched from the store instead


def _copy_local(
    base_fd: int, base_off: int, n: int, sink: _Sink, off: int, buf: bytearray
) -> bytes | memoryview | None:
    """A chunk the verified local base already holds: copied, not fetched (runs in the pool)."""
    view = memoryview(buf)[:n]
    try:
        got = os.preadv(base_fd, [view], base_off)
        if got != n:
            raise CheckpointError(f"pre-staged base is shorter than expected at offset {base_off}",
                                  object=str(base_fd))
        sink.write(off, view)
    finally:
        view.release()
    return None
