"""Files in the temporary directory a rank holds open or mapped: a compiler's cache, a library's scratch files.

CRIU records an open or mapped file by its path and opens it by that path at restore. ``torch.compile``
(TorchInductor) builds the code it generates into shared objects under ``/tmp/torchinductor_USER`` (the
temporary directory: ``TMPDIR``, else ``/tmp``) and loads them, so a compiled job maps files there for the
rest of its life. On another machine they are absent, and the restore fails (``Can't open file
tmp/torchinductor_.../....so on restore``); the same where the directory was cleaned meanwhile.

So a checkpoint carries the content of every regular file under the temporary directories (the job's
``TMPDIR``, ``/tmp``, ``/var/tmp``) that a rank holds open or mapped, outside the job's working directory
(its own state, saved apart) and while the file still has that name (a file without a name is CRIU's
ghost file). A restore puts each back where it is missing or differs (size or mtime), with its mode and
mtime, making the directories above it as the job's account; a file that is there as it was is left
alone. Files the job only reads now and then are not held, and not carried: a compiler's cache is rebuilt
(to the same bytes) when missing.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidal.errors import CheckpointError
from tidal.mechanisms.accounts import Account, acting_as
from tidal.mechanisms.criu.shmfiles import _copy, _links
from tidal.mechanisms.permissions import private_dir

ROOTS = ("/tmp", "/var/tmp")


@dataclass(frozen=True)
class TmpFile:
    """One file a checkpoint carries: its absolute path, mode, size and mtime (its content is stored with the
    checkpoint under its index)."""

    path: str
    mode: int
    size: int
    mtime_ns: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TmpFile:
        return cls(str(data["path"]), int(data["mode"]), int(data["size"]), int(data["mtime_ns"]))


def roots(env: Mapping[str, str]) -> list[str]:
    """The temporary directories of a job with environment ``env``, each ending in "/"."""
    out = [env["TMPDIR"]] if env.get("TMPDIR", "").startswith("/") else []
    out += ROOTS
    return [os.path.normpath(r).rstrip("/") + "/" for r in out]


def held(pids: Iterable[int], env: Mapping[str, str], skip: Iterable[Path]) -> dict[str, str]:
    """path → a /proc path that opens it, for each regular file under the job's temporary directories and
    outside the directories of ``skip`` (the job's working directory, Tidal's own) that a process of
    ``pids`` holds open or mapped and that still has that path."""
    under = roots(env)
    own = tuple(os.path.normpath(d).rstrip("/") + "/" for d in skip)
    found: dict[str, str] = {}
    for pid in pids:
        for link, path in _links(pid):
            if (path in found or path.endswith(" (deleted)") or path.startswith(own)
                    or not any(path.startswith(r) for r in under)):
                continue
            try:
                st = os.stat(link)
                now = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 0 and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                found[path] = link
    return found


def capture(pids: Iterable[int], env: Mapping[str, str], skip: Iterable[Path], into: Path) -> list[TmpFile]:
    """Copy every file :func:`held` finds into ``into`` (as ``0``, ``1``, ... in the order of the list
    returned); call while the processes are frozen."""
    files: list[TmpFile] = []
    for path, link in sorted(held(pids, env, skip).items()):
        private_dir(into)
        try:
            src = os.open(link, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise CheckpointError(f"cannot read temporary file {path} the job holds: {exc}", object=path,
                                  hint="the job goes on; its last good checkpoint is untouched") from exc
        try:
            st = os.fstat(src)
            dst = os.open(into / str(len(files)), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                _copy(src, dst, st.st_size)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        files.append(TmpFile(path, stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns))
    return files


def put_back(files: Iterable[tuple[TmpFile, Path]], env: Mapping[str, str], who: Account | None = None) -> None:
    """Put each file (its content in the given local copy) back at its path where it is missing or differs,
    as ``who`` (the job's account): to a new file next to it, renamed over the path. ``env``: the job's
    environment (its temporary directories are the only places written)."""
    for f, src in files:
        target = Path(f.path)
        if (os.path.normpath(f.path) != f.path or not any(f.path.startswith(r) for r in roots(env))):
            raise CheckpointError(f"checkpoint holds a bad temporary file path {f.path!r}", object=f.path,
                                  hint="the checkpoint is damaged: restore an earlier one")
        try:
            with acting_as(who):
                with contextlib.suppress(OSError):
                    now = os.lstat(target)
                    if stat.S_ISREG(now.st_mode) and (now.st_size, now.st_mtime_ns) == (f.size, f.mtime_ns):
                        continue  # there as it was
                target.parent.mkdir(parents=True, exist_ok=True)
            sfd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)  # Tidal's own copy, read as the agent
            try:
                with acting_as(who):
                    tmp = target.with_name(f".tidal-restore-{uuid.uuid4().hex}")
                    dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                    try:
                        try:
                            _copy(sfd, dst, f.size)
                            os.fchmod(dst, f.mode)
                            os.utime(dst, ns=(f.mtime_ns, f.mtime_ns))
                        finally:
                            os.close(dst)
                        os.replace(tmp, target)
                    except BaseException:
                        with contextlib.suppress(OSError):
                            tmp.unlink()
                        raise
            finally:
                os.close(sfd)
        except OSError as exc:
            raise CheckpointError(f"cannot put back temporary file {f.path} of the checkpoint: {exc}",
                                  object=f.path, hint="the job's temporary directory must be writable by its "
                                  "account, and the path not taken by another account's file") from exc
