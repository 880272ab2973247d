"""Where store objects live: a local directory (plain os calls), S3 (:mod:`.s3`) or any fsspec filesystem.

Keys are relative POSIX paths (``chunks/ab/ab12...``, ``jobs/J/C/manifest.json``). Every put is
atomic: an object is either absent or complete under its final key.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tidal.errors import ConfigError, StorageError

from .retry import RetryPolicy, retrying

if TYPE_CHECKING:
    from .s3 import S3Backend

T = TypeVar("T")

_FULL = (errno.ENOSPC, errno.EDQUOT)
DIR_MODE = 0o700
FILE_MODE = 0o600


def storage_error(e: OSError, what: str, where: str) -> StorageError:
    """Turn an OSError into a StorageError that says, for a full store, that it is full and where."""
    if e.errno in _FULL:
        return StorageError(
            f"checkpoint store full: no space left {what} {where}",
            object=where,
            reason="store full",
            hint="free space in the checkpoint store or lower the number of retained checkpoints",
        )
    return StorageError(f"checkpoint store error {what} {where}: {e}", object=where, reason=str(e),
                        hint="check that the checkpoint store is reachable and Tidal may write to it")


class Backend(Protocol):
    url: str

    def exists(self, key: str) -> bool: ...

    def get(self, key: str) -> bytes:
        """The object's bytes; ``FileNotFoundError`` when absent."""
        ...

    def get_into(self, key: str, buf: bytearray) -> bytes | memoryview:
        """Like :meth:`get`, reading into ``buf`` when the object fits (the result may be a view of it)."""
        ...

    def put_chunk(self, key: str, tag: bytes, payload: bytes | memoryview) -> int:
        """Store ``tag + payload`` atomically (not yet durable); return the bytes written."""
        ...

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """Store ``data`` atomically; ``durable`` also makes it (and its name) survive a crash."""
        ...

    def make_durable(self, keys: Sequence[str], pool: Executor) -> None:
        """Make earlier ``put_chunk`` objects durable, before a manifest that names them is put."""
        ...

    def listdir(self, key: str) -> list[str]:
        """Names directly under ``key`` (empty when absent)."""
        ...

    def mkdir(self, key: str) -> bool:
        """Create the directory ``key`` (parents too); return False if it already existed."""
        ...

    def chunks(self) -> Iterator[tuple[str, float | None]]:
        """Every object under ``chunks/`` (crash leftovers too): its key and, where the listing says it at no
        extra cost, when it was last written (else None: :meth:`modified` asks)."""
        ...

    def modified(self, key: str) -> float | None:
        """When the object was last written (seconds since the epoch, the store's clock); None when absent."""
        ...

    def delete(self, key: str) -> None: ...

    def delete_tree(self, key: str) -> None: ...

    def close(self) -> None:
        """Let go of what the backend holds (threads, connections)."""
        ...


class LocalBackend:
    """A directory on a local filesystem: directories 0700, files 0600, temp+rename for atomicity."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.url = str(self.root)
        self._dirs: set[str] = set()
        self._dirs_lock = threading.Lock()
        try:
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            st = self.root.stat()
            if st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.chmod(self.root, DIR_MODE)  # checkpoint images hold process memory
        except OSError as e:
            raise storage_error(e, "creating the store at", str(self.root)) from None

    def _path(self, key: str) -> str:
        return os.path.join(self.url, key)

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                return f.read()
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_error(e, "reading", self._path(key)) from None

    def get_into(self, key: str, buf: bytearray) -> bytes | memoryview:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_error(e, "reading", path) from None
        try:
            size = os.fstat(fd).st_size
            if size > len(buf):
                buf = bytearray(size)
            view = memoryview(buf)[:size]
            got = 0
            while got < size:
                k = os.readv(fd, [view[got:]])
                if k == 0:
                    break
                got += k
            return view[:got]
        except OSError as e:
            raise storage_error(e, "reading", path) from None
        finally:
            os.close(fd)

    def _ensure_dir(self, d: str) -> None:
        # Chunk directories are never removed, so they are remembered; checkpoint directories may be.
        if d in self._dirs:
            return
        self.mkdir(d)
        if d.startswith("chunks/"):
            with self._dirs_lock:
                self._dirs.add(d)

    def mkdir(self, key: str) -> bool:
        path = self._path(key)
        if os.path.isdir(path):
            return False
        parent = os.path.dirname(key)
        if parent:
            self.mkdir(parent)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return False
        except OSError as e:
            raise storage_error(e, "creating directory", path) from None
        return True

    def _write_tmp(self, key: str, parts: Sequence[bytes | memoryview], *, sync: bool) -> tuple[str, int]:
        final = self._path(key)
        tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{secrets.token_hex(4)}.tmp")
        total = sum(len(p) for p in parts)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except OSError as e:
            raise storage_error(e, "writing", tmp) from None
        try:
            try:
                _write_all(fd, parts)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise storage_error(e, "writing", final) from None
        return final, total

    def put_chunk(self, key: str, tag: bytes, payload: bytes | memoryview) -> int:
        self._ensure_dir(os.path.dirname(key))
        return self._write_tmp(key, (tag, payload), sync=False)[1]

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._ensure_dir(os.path.dirname(key))
        final, _ = self._write_tmp(key, (data,), sync=durable)
        if durable:
            try:
                _fsync_dir(os.path.dirname(final))
            except OSError as e:
                raise storage_error(e, "syncing", final) from None

    def make_durable(self, keys: Sequence[str], pool: Executor) -> None:
        if not keys:
            return
        # One syncfs flushes the whole batch with a single journal commit; fsync per file costs a
        # commit each. Fall back to per-file fsync (in parallel) where syncfs is unavailable.
        if _syncfs(self.url):
            return
        paths = [self._path(k) for k in keys]
        list(pool.map(_fsync_path, paths))
        for d in sorted({os.path.dirname(p) for p in paths}):
            _fsync_dir(d)

    def listdir(self, key: str) -> list[str]:
        try:
            return os.listdir(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise storage_error(e, "listing", self._path(key)) from None

    def chunks(self) -> Iterator[tuple[str, float | None]]:
        for sub in self.listdir("chunks"):
            for name in self.listdir(f"chunks/{sub}"):
                yield f"chunks/{sub}/{name}", None

    def close(self) -> None:
        return None

    def modified(self, key: str) -> float | None:
        try:
            return os.stat(self._path(key)).st_mtime
        except FileNotFoundError:
            return None
        except OSError as e:
            raise storage_error(e, "reading", self._path(key)) from None

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def delete_tree(self, key: str) -> None:
        top = self._path(key)
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for f in filenames:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, f))
            for d in dirnames:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(os.path.join(dirpath, d))
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(top)


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_libc: Any = None


def _syncfs(path: str) -> bool:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.syncfs.argtypes = [ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise storage_error(OSError(e, os.strerror(e)), "syncing", path)
        return True
    finally:
        os.close(fd)


_FSSPEC_HINT = "check that the checkpoint store is reachable from this node and Tidal may write to it"


class FsspecBackend:
    """Any fsspec filesystem (``gs://``, ``az://``, ``memory://`` ...): single puts are atomic. Requests that
    fail on the way or with a server error are tried again (:mod:`.retry`).

    Where the filesystem does not say when an object was written, garbage collection cannot spare the chunks
    of writers in progress (:mod:`.sweep`): collect only while nothing is being written.
    """

    def __init__(self, url: str, *, retry: RetryPolicy | int | None = None, **storage_options: Any) -> None:
        import fsspec

        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        self.retry = RetryPolicy(attempts=max(1, retry)) if isinstance(retry, int) else retry or RetryPolicy()

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _do(self, fn: Callable[[], T], what: str, key: str) -> T:
        """``fn()`` with retries; FileNotFoundError passes, other OSErrors become StorageErrors."""
        try:
            return retrying(fn, self.retry, what, self._path(key), hint=_FSSPEC_HINT)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise storage_error(e, what, self._path(key)) from None

    def exists(self, key: str) -> bool:
        return bool(self._do(lambda: self.fs.exists(self._path(key)), "checking", key))

    def get(self, key: str) -> bytes:
        return bytes(self._do(lambda: self.fs.cat_file(self._path(key)), "reading", key))

    def get_into(self, key: str, buf: bytearray) -> bytes | memoryview:
        return self.get(key)

    def put_chunk(self, key: str, tag: bytes, payload: bytes | memoryview) -> int:
        data = tag + bytes(payload)
        self.put(key, data)
        return len(data)

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._do(lambda: self.fs.pipe_file(self._path(key), data), "writing", key)

    def make_durable(self, keys: Sequence[str], pool: Executor) -> None:
        return None  # a completed object put is durable

    def listdir(self, key: str) -> list[str]:
        try:
            entries = self._do(lambda: self.fs.ls(self._path(key), detail=False), "listing", key)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = self._path(key).strip("/")
        out = []
        for p in entries:
            p = str(p).strip("/")
            if p != base:
                out.append(p.rsplit("/", 1)[-1])
        return out

    def chunks(self) -> Iterator[tuple[str, float | None]]:
        for sub in self.listdir("chunks"):
            for name in self.listdir(f"chunks/{sub}"):
                yield f"chunks/{sub}/{name}", None

    def mkdir(self, key: str) -> bool:
        return True  # object stores have no directories; a key's prefix exists once it holds an object

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._do(lambda: self.fs.rm_file(self._path(key)), "deleting", key)

    def delete_tree(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._do(lambda: self.fs.rm(self._path(key), recursive=True), "deleting", key)

    def modified(self, key: str) -> float | None:
        try:
            info = self._do(lambda: self.fs.info(self._path(key)), "checking", key)
        except FileNotFoundError:
            return None
        for field in ("mtime", "LastModified", "last_modified", "updated", "created"):
            value = info.get(field)
            if isinstance(value, (int, float)):
                return float(value)
            if hasattr(value, "timestamp"):
                return float(value.timestamp())
        return 0.0  # unknown: as if old

    def close(self) -> None:
        return None


def open_backend(url: str | os.PathLike[str], **storage_options: Any) -> LocalBackend | S3Backend | FsspecBackend:
    """A local path or ``file://`` URL gives the fast local backend, ``s3://`` the S3 backend (options: see
    :class:`~tidal.mechanisms.storage.s3.S3Backend`); anything else goes to fsspec."""
    s = os.fspath(url)
    if s.startswith("file://"):
        return LocalBackend(Path(s[len("file://") :]))
    if "://" not in s:
        return LocalBackend(Path(s))
    if s.startswith(("s3://", "s3a://")):
        from .s3 import S3Backend

        base, given = split_s3_url(s)
        return S3Backend(base, **{**storage_options, **given})
    return FsspecBackend(s, **storage_options)


#: What an ``s3://`` URL may say of its server after ``?``: a store per region may be on another one.
_URL_OPTIONS = {"endpoint": "endpoint_url", "region": "region", "addressing": "addressing_style"}


def split_s3_url(url: str) -> tuple[str, dict[str, str]]:
    """``s3://BUCKET/PREFIX?endpoint=URL&region=R&addressing=path`` → the URL without its query, and the
    options it names (they win over the node's settings: they are this store's own)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    out: dict[str, str] = {}
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if key not in _URL_OPTIONS or not eq or not value:
            raise ConfigError(f"the checkpoint store {url}: {item!r} is not an option of an S3 store's URL",
                              hint="an s3:// URL may end in ?endpoint=URL&region=R&addressing=path|virtual")
        out[_URL_OPTIONS[key]] = urllib.parse.unquote(value)
    return base, out
