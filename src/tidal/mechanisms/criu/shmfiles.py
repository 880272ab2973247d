"""Shared-memory files (``/dev/shm``) a rank holds open or mapped while they still have a name.

CRIU records such a file by its path and opens it by that path at restore; only a file that has no name
left is copied into the images (a *ghost* file). But ``/dev/shm`` is one machine's memory: the file is
absent on any other machine, and on this one a process may remove it right after the dump. torch's
DataLoader workers do that for every batch they hand over (``shm_open``, ``ftruncate``, ``mmap``,
``shm_unlink``, then the descriptor is passed on), and so does ``multiprocessing`` for its semaphores: a
worker frozen between ``shm_open`` and ``shm_unlink`` is dumped holding a file by a name it removes as soon
as it runs again (a periodic checkpoint lets it go on), and the restore then fails with
``Can't open file dev/shm/torch_... on restore: No such file or directory``.

So a checkpoint carries the content of every such file (read while the rank is frozen), and a restore puts
each back under its name before CRIU runs. Only objects directly in ``/dev/shm`` are handled (``shm_open``
and ``sem_open`` names have no directory part): a name is put back by a rename inside that one
directory, never through a directory the job could have replaced by a symbolic link.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidal.errors import CheckpointError
from tidal.mechanisms.accounts import Account, acting_as
from tidal.mechanisms.permissions import private_dir

SHM = Path("/dev/shm")
_PROC = Path("/proc")


@dataclass(frozen=True)
class ShmFile:
    """One file of ``/dev/shm`` a checkpoint carries: its name there and its mode (its content is stored
    with the checkpoint under :attr:`name`)."""

    name: str  # the file's name in /dev/shm
    mode: int
    size: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShmFile:
        return cls(str(data["name"]), int(data["mode"]), int(data["size"]))


def _links(pid: int) -> Iterable[tuple[str, str]]:
    """(a /proc path that opens the file, the file's path) for every open file and file mapping of ``pid``."""
    fd_dir = _PROC / str(pid) / "fd"
    with contextlib.suppress(OSError):
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                yield str(fd_dir / fd), os.readlink(fd_dir / fd)
    with contextlib.suppress(OSError):
        for line in (_PROC / str(pid) / "maps").read_text().splitlines():
            f = line.split(maxsplit=5)
            if len(f) == 6 and f[5].startswith("/"):
                yield str(_PROC / str(pid) / "map_files" / f[0]), f[5]


def held(pids: Iterable[int], shm: Path = SHM) -> dict[str, str]:
    """name → a /proc path that opens it, for each file directly in ``shm`` that a process of ``pids`` holds
    open or mapped and that still has that name (the very same file: not one created since under the same
    name). Files without a name are left to CRIU (ghost files)."""
    prefix = f"{shm}/"
    found: dict[str, str] = {}
    for pid in pids:
        for link, path in _links(pid):
            if not path.startswith(prefix) or path.endswith(" (deleted)"):
                continue
            name = path[len(prefix):]
            if not name or "/" in name or name in found:
                continue
            try:
                st = os.stat(link)
                now = os.lstat(shm / name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 0 and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                found[name] = link
    return found


def capture(pids: Iterable[int], into: Path, shm: Path = SHM) -> list[ShmFile]:
    """Copy every file of ``shm`` that ``pids`` hold by name (see :func:`held`) into ``into`` (under its
    name); call while the processes are frozen."""
    files = []
    for name, link in sorted(held(pids, shm).items()):
        private_dir(into)
        try:
            src = os.open(link, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise CheckpointError(f"cannot read shared-memory file {shm / name} the job holds: {exc}",
                                  object=str(shm / name), hint="the job goes on; its last good checkpoint is "
                                  "untouched") from exc
        try:
            st = os.fstat(src)
            dst = os.open(into / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                _copy(src, dst, st.st_size)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        files.append(ShmFile(name, stat.S_IMODE(st.st_mode), st.st_size))
    return files


def _copy(src: int, dst: int, size: int) -> None:
    done = 0
    while done < size:
        chunk = os.pread(src, min(1 << 20, size - done), done)
        if not chunk:
            break
        os.write(dst, chunk)
        done += len(chunk)
    os.ftruncate(dst, size)  # holes, or a file that shrank meanwhile: exactly the recorded size


def put_back(files: Iterable[tuple[ShmFile, Path]], who: Account | None = None, shm: Path = SHM) -> None:
    """Write each file (its content in the given local copy) into ``shm`` under its name, as ``who`` (the job's
    account): to a new file, renamed over the name, so that a process still using a file of that name keeps
    its own."""
    for f, src in files:
        if not f.name or "/" in f.name or f.name in (".", ".."):
            raise CheckpointError(f"checkpoint holds a bad shared-memory file name {f.name!r}", object=f.name,
                                  hint="the checkpoint is damaged: restore an earlier one")
        sfd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)  # Tidal's own copy, read as the agent
        try:
            with acting_as(who):
                tmp = shm / f".tidal-restore-{uuid.uuid4().hex}"
                dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    try:
                        _copy(sfd, dst, f.size)
                        os.fchmod(dst, f.mode)
                    finally:
                        os.close(dst)
                    os.replace(tmp, shm / f.name)
                except BaseException:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
                    raise
        except OSError as exc:
            raise CheckpointError(f"cannot put back shared-memory file {shm / f.name} of the checkpoint: {exc}",
                                  object=str(shm / f.name),
                                  hint=f"{shm} must be writable by the job's account, and its name not taken by "
                                       "another account's file") from exc
        finally:
            os.close(sfd)
