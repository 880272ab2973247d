"""Reading one committed checkpoint back, verifying every chunk and every file's sha256."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.errors import CheckpointCorrupt, CheckpointError, UndecodableChunk

from .chunks import chunk_key, zero_digest, zeros
from .manifest import CheckpointInfo, Entry, Manifest, file_digest

if TYPE_CHECKING:
    from .store import CheckpointStore

_RETRY = "the staged images changed while the restore read them: restore again"


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
        return CheckpointError(f"cannot restore {self.dest}: {e}", object=str(self.dest),
                               hint="the working directory must be writable and have room for the checkpoint's files")

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


class _PatchSink(_FileSink):
    """Turns a local base file into ``dest`` in place: chunks it holds are moved to their new offsets
    within it, the others written into it, and it is renamed over ``dest`` once verified. A base that
    fails half-way is removed (it is neither the old file nor the new one)."""

    def __init__(self, base: Path, dest: Path) -> None:
        super().__init__(dest)
        self.tmp = Path(base)

    def open(self, entry: Entry) -> None:
        self.entry = entry
        try:
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.tmp, os.O_RDWR | os.O_CLOEXEC)
            if os.fstat(self.fd).st_size < entry.size:
                os.ftruncate(self.fd, entry.size)
        except OSError as e:
            raise self._error(e) from None

    def move(self, moves: list[tuple[int, int, int]], buf: bytearray) -> None:
        """Copy (dest, src, n) ranges within the file, in the given order (see :func:`_patch_plan`)."""
        for dest, src, n in moves:
            view = memoryview(buf)[:n]
            try:
                if os.preadv(self.fd, [view], src) != n:
                    raise CheckpointError(f"pre-staged base {self.tmp} is shorter than expected at offset {src}",
                                          object=str(self.tmp), hint=_RETRY)
                self.write(dest, view)
            except OSError as e:
                raise self._error(e) from None
            finally:
                view.release()

    def finish(self) -> None:
        assert self.entry is not None
        try:
            if self.fd >= 0 and os.fstat(self.fd).st_size > self.entry.size:
                os.ftruncate(self.fd, self.entry.size)
        except OSError as e:
            self.fail()
            raise self._error(e) from None
        super().finish()


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
        # Bytes (uncompressed) of the chunks fetched from the store so far, not those taken from a local
        # base nor known zeros: what a pre-staged restore saves shows here.
        self.fetched_bytes = 0

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
                f"{name!r} is not in checkpoint {self.info.job_id}/{self.info.id}", object=name,
                hint="its entries() are what it holds"
            ) from None

    def extract(self, name: str, dest: Path | str) -> None:
        """Write file ``name`` to ``dest`` (temp file + rename) after verifying it."""
        self.extract_all([(name, Path(dest))])

    def extract_all(
        self,
        pairs: Iterable[tuple[str, Path | str]],
        *,
        bases: Mapping[str, tuple[Path, Entry]] | None = None,
        consume_bases: bool = False,
    ) -> None:
        """Extract many files; their chunks are fetched and verified in parallel.

        ``bases``: for some names, a local file that holds the content of an earlier entry and was verified
        when it was put there (a pre-staged earlier checkpoint). Chunks it holds (same digest, wherever they
        sit in it) are copied from it; only the others are fetched from the store and verified.
        ``consume_bases``: a base that holds at least half of its new file becomes that file in place: its
        chunks are moved within it to where the new file has them (CRIU page files shift when a memory
        region grows), the others are written into it, and it is renamed to the destination (it is gone
        afterwards). No new memory is filled with what the base already held."""
        bases = bases or {}
        items: list[tuple[Entry, _Sink]] = []
        local: list[_Base | None] = []
        for n, d in pairs:
            entry = self.entry(n)
            base = bases.get(n)
            if base is None:
                items.append((entry, _FileSink(Path(d))))
                local.append(None)
                continue
            plan = (_patch_plan(entry, base[1])
                    if consume_bases and entry.kind == "file" and _same_device(Path(base[0]), Path(d)) else None)
            if plan is not None:
                items.append((entry, _PatchSink(Path(base[0]), Path(d))))
                local.append(_Base(base[0], {}, plan))
            else:
                items.append((entry, _FileSink(Path(d))))
                local.append(_Base(base[0], {h: off for off, _, h in _placed(base[1].chunks)}, None))
        self._run(items, fetch_zero=False, local=local)

    def read_bytes(self, name: str) -> bytes:
        entry = self.entry(name)
        if entry.kind != "file":
            raise CheckpointError(f"{name!r} is a {entry.kind}, not a file", object=name,
                                  hint="only a file's bytes can be read")
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
        local: list[_Base | None] | None = None,
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
                plan = here.plan if here is not None else None
                base_fd, base_at = (-1, {}) if here is None or plan is not None else (_open_base(here.path), here.at)
                if base_fd >= 0:
                    base_fds.append(base_fd)
                st = _State(entry, sink, self.info.id)
                sink.open(entry)
                opened.append(st)
                if plan is not None:
                    # Moves first, in order: a chunk written later may land where a move reads from.
                    while not free:
                        _drain_one(window, free)
                    buf = free.pop()
                    try:
                        assert isinstance(sink, _PatchSink)
                        sink.move(plan.moves, buf)
                    finally:
                        free.append(buf)
                if entry.kind == "symlink":
                    st.hash.update((entry.target or "").encode())
                off = 0
                for digest, n in entry.chunks:
                    if plan is not None and off in plan.placed:
                        off += n  # already there, or moved there
                        continue
                    while not free:
                        _drain_one(window, free)
                    buf = free.pop()
                    from_base = base_at.get(digest) if base_fd >= 0 and digest != zero_digest(n) else None
                    if plan is not None and digest == zero_digest(n):
                        fut = store.pool.submit(_write_zeros, sink, off, n)
                    elif from_base is not None:
                        fut = store.pool.submit(_copy_local, base_fd, from_base, n, sink, off, buf)
                    else:
                        if fetch_zero or digest != zero_digest(n):
                            self.fetched_bytes += n
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

    def _bad_chunk(self, entry: Entry, digest: str, what: str, reason: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(
            f"checkpoint {self.info.job_id}/{self.info.id}: file {entry.name!r}: chunk {digest} {what}",
            checkpoint=self.info.id,
            object=entry.name,
            chunk=digest,
            reason=reason,
        )

    def _fetch(
        self, entry: Entry, digest: str, n: int, sink: _Sink, off: int, fetch_zero: bool, buf: bytearray
    ) -> bytes | memoryview | None:
        if not fetch_zero and digest == zero_digest(n):
            return None  # content is known from the digest; the sink already holds zeros
        store = self._store
        key = chunk_key(digest)
        try:
            raw = store.backend.get_into(key, buf)
        except FileNotFoundError:
            raise self._bad_chunk(entry, digest, f"is missing from the store ({key})", "missing") from None
        try:
            data = store.codec.decode(raw, n)
        except UndecodableChunk as e:
            raise self._bad_chunk(entry, digest, f"is {e.message}", e.fields["reason"]) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise self._bad_chunk(entry, digest, "is corrupt (sha256 mismatch)", "sha256 mismatch")
        sink.write(off, data)
        return data


class _State:
    def __init__(self, entry: Entry, sink: _Sink, checkpoint: str) -> None:
        self.entry = entry
        self.sink = sink
        self.checkpoint = checkpoint
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
            raise CheckpointCorrupt(
                f"checkpoint {st.checkpoint}: file {st.entry.name!r}: its chunk list does not match its sha256 "
                "(damaged manifest entry)",
                checkpoint=st.checkpoint,
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


@dataclass(frozen=True)
class _Plan:
    """How a base becomes its new file in place."""

    moves: list[tuple[int, int, int]]  # (dest, src, n), in an order in which no move reads a range written
    placed: set[int]  # offsets of the new file's chunks that the base holds (in place, or once moved)


@dataclass(frozen=True)
class _Base:
    """A verified local file that an extracted file may take chunks from."""

    path: Path
    at: dict[str, int]  # digest -> offset: chunks copied from wherever they sit
    plan: _Plan | None  # patched in place instead


def _patch_plan(entry: Entry, base: Entry) -> _Plan | None:
    """The moves that turn ``base``'s content into ``entry``'s within one file, or None where that is not
    worth it (the base holds less than half of the new file) or not possible in one pass.

    Moved backwards (from the last chunk) when every chunk moves towards the end, forwards when every one
    moves towards the start: a move then never reads a range that an earlier one wrote. Chunks that would
    move the other way are fetched instead."""
    at: dict[str, int] = {}
    same: dict[int, str] = {}
    for off, _, h in _placed(base.chunks):
        at.setdefault(h, off)
        same[off] = h
    pairs = []
    for off, n, h in _placed(entry.chunks):
        if h == zero_digest(n):
            continue
        src = off if same.get(off) == h else at.get(h)
        if src is not None:
            pairs.append((off, src, n))
    later = sum(n for off, src, n in pairs if src < off)
    earlier = sum(n for off, src, n in pairs if src > off)
    towards_end = later >= earlier
    keep = [(off, src, n) for off, src, n in pairs if (src <= off if towards_end else src >= off)]
    if 2 * sum(n for _, _, n in keep) < entry.size:
        return None
    moves = sorted(((off, src, n) for off, src, n in keep if off != src), reverse=towards_end)
    return _Plan(moves, {off for off, _, _ in keep})


def _same_device(base: Path, dest: Path) -> bool:
    """Whether ``base`` can be renamed to ``dest`` (whose parents may not exist yet)."""
    there = dest.parent
    while not there.exists() and there != there.parent:
        there = there.parent
    try:
        return os.stat(base).st_dev == os.stat(there).st_dev
    except OSError:
        return False


def _write_zeros(sink: _Sink, off: int, n: int) -> bytes | memoryview | None:
    """A zero chunk where a base patched in place holds something else (runs in the pool)."""
    sink.write(off, zeros(n))
    return None


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
                                  object=str(base_fd), hint=_RETRY)
        sink.write(off, view)
    finally:
        view.release()
    return None
