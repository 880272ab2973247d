"""A job's file-system state: what it changed under its working directory since launch.

At launch Tidal records the stat of every entry (the *baseline*, the job's inputs). A checkpoint records
every entry as it is while the job is frozen, and copies the content of files that differ from the
baseline (new or modified). Restore makes the directory exactly what it was at the checkpoint: it writes
the captured files, deletes entries created after it, and checks that inputs are still as they were.
Inputs are never copied: in a cluster they live on shared storage, mounted at the same path everywhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidal.errors import CheckpointError
from tidal.mechanisms.accounts import Account, acting_as
from tidal.mechanisms.permissions import private_dir

# Opening a job's file: never through a symlink in its last component (the job may have planted one).
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _copy_fd(src: int, dst: int) -> None:
    size = os.fstat(src).st_size
    done = 0
    with contextlib.suppress(OSError):  # EXDEV, ENOSYS, EINVAL: copied below instead
        while done < size:
            n = os.copy_file_range(src, dst, size - done)
            if n == 0:
                break
            done += n
    while chunk := os.read(src, 1 << 20):  # what grew meanwhile, or a file system without copy_file_range
        os.write(dst, chunk)


@dataclass(frozen=True)
class Entry:
    kind: str  # "f" file, "d" directory, "l" symlink
    mode: int
    size: int = 0
    # Files and directories (0: not recorded, as in checkpoints made before directories' were). A job may
    # order its own files by time: Hugging Face's Trainer deletes its oldest checkpoint directory by mtime.
    mtime_ns: int = 0
    target: str = ""

    def same_content_as(self, other: Entry) -> bool:
        if self.kind != other.kind:
            return False
        if self.kind == "f":
            return self.size == other.size and self.mtime_ns == other.mtime_ns
        if self.kind == "l":
            return self.target == other.target
        return True


def _walk(root: Path, rel: str = "", ignore: frozenset[str] = frozenset()) -> Iterator[tuple[str, os.DirEntry[str]]]:
    with os.scandir(root / rel if rel else root) as it:
        for de in it:
            path = f"{rel}/{de.name}" if rel else de.name
            if path in ignore:  # and all beneath it
                continue
            yield path, de
            if de.is_dir(follow_symlinks=False):
                yield from _walk(root, path, ignore)


def scan(root: Path, ignore: frozenset[str] = frozenset()) -> dict[str, Entry]:
    """Every entry under ``root`` (not following symlinks), keyed by relative POSIX path; those of
    ``ignore``, and what lies beneath them, left out."""
    out: dict[str, Entry] = {}
    for path, de in _walk(root, ignore=ignore):
        st = de.stat(follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            out[path] = Entry("f", mode, st.st_size, st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode):
            out[path] = Entry("d", mode, mtime_ns=st.st_mtime_ns)
        elif stat.S_ISLNK(st.st_mode):
            out[path] = Entry("l", mode, target=os.readlink(root / path))
        # sockets, fifos, devices: not part of a job's saved state
    return out


@dataclass
class FsSnapshot:
    """The directory at a checkpoint: all entries, and which files' content the checkpoint carries."""

    entries: dict[str, Entry]
    captured: list[str]  # paths whose content is stored with the checkpoint

    def to_json(self) -> dict[str, Any]:
        return {"entries": {p: asdict(e) for p, e in self.entries.items()}, "captured": self.captured}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FsSnapshot:
        return cls({p: Entry(**e) for p, e in data["entries"].items()}, list(data["captured"]))


class FsTracker:
    """Tracks one job's working directory against its launch-time baseline. Every access to the directory
    is made as ``who``, the job's account (see :mod:`tidal.mechanisms.accounts`); Tidal's own staging
    area is accessed as the agent."""

    def __init__(self, workdir: Path, baseline: dict[str, Entry], who: Account | None = None,
                 ignore: frozenset[str] = frozenset()) -> None:
        """``ignore``: files and directories (relative paths) of the directory that are not the job's state
        and are left alone, neither saved nor put back: the output files a batch system writes the job's
        output to, still open; a checkpoint store or node root that lies inside it."""
        self.workdir = workdir
        self.baseline = baseline
        self.who = who
        self.ignore = ignore

    def _ignored(self, path: str) -> bool:
        return any(path == i or path.startswith(i + "/") for i in self.ignore)

    @classmethod
    def at_launch(cls, workdir: Path, who: Account | None = None, ignore: frozenset[str] = frozenset()) -> FsTracker:
        with acting_as(who):
            return cls(workdir, scan(workdir, ignore), who, ignore)

    def baseline_json(self) -> dict[str, Any]:
        return {p: asdict(e) for p, e in self.baseline.items()}

    @classmethod
    def from_json(cls, workdir: Path, data: dict[str, Any], who: Account | None = None,
                  ignore: frozenset[str] = frozenset()) -> FsTracker:
        self = cls(workdir, {}, who, ignore)
        self.baseline = {p: Entry(**e) for p, e in data.items() if not self._ignored(p)}
        return self

    def capture(self, staging: Path) -> FsSnapshot:
        """Record the directory now and copy changed files into ``staging`` (call while the job is frozen)."""
        with acting_as(self.who):
            if not self.workdir.is_dir():
                raise CheckpointError(f"working directory {self.workdir} has disappeared",
                                      object=str(self.workdir),
                                      hint="a job's working directory must stay in place while the job lives")
            entries = scan(self.workdir, self.ignore)
        captured = []
        for path, entry in entries.items():
            if entry.kind != "f":
                continue
            base = self.baseline.get(path)
            if base is not None and base.same_content_as(entry):
                continue
            dest = staging / path
            private_dir(dest.parent)
            with acting_as(self.who):
                src = os.open(self.workdir / path, _READ)
            try:
                dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                try:
                    _copy_fd(src, dst)  # in-kernel where the file system can
                finally:
                    os.close(dst)
            finally:
                os.close(src)
            captured.append(path)
        return FsSnapshot(entries, captured)

    def restore(self, snap: FsSnapshot, fetch: Callable[[list[str], Path], None], scratch: Path) -> None:
        """Put the working directory back as in ``snap``. ``fetch(paths, into)`` writes the captured files
        of ``paths`` under ``into`` (verified); nothing in the working directory changes unless all of them
        arrived and every input is intact."""
        if self.ignore:
            snap = FsSnapshot({p: e for p, e in snap.entries.items() if not self._ignored(p)},
                              [p for p in snap.captured if not self._ignored(p)])
        with acting_as(self.who):
            if not self.workdir.is_dir():
                raise CheckpointError(f"cannot restore: working directory {self.workdir} does not exist on "
                                      "this node", object=str(self.workdir),
                                      hint="the working directory must exist at the same path on every node")
            current = scan(self.workdir, self.ignore)
        for path, entry in snap.entries.items():
            if entry.kind == "f" and path not in snap.captured:
                now = current.get(path)
                if now is None or not now.same_content_as(entry):
                    raise CheckpointError(
                        f"cannot restore: input file {self.workdir / path} changed or vanished since the "
                        "checkpoint, and inputs are not copied into checkpoints", object=path,
                        hint="keep a job's input files unchanged while it runs")
        private_dir(scratch)
        fetch(snap.captured, scratch)
        with acting_as(self.who):
            self._put_back(snap, current)
        for path in snap.captured:
            want = snap.entries[path]
            target = self.workdir / path
            # Next to the target, then renamed: atomic per file, whatever file system scratch is on.
            tmp = target.with_name(f".{target.name}.tidal-restore")
            src = os.open(scratch / path, _READ)  # Tidal's own copy, read as the agent
            try:
                with acting_as(self.who):
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()  # a leftover of an interrupted restore
                    dst = os.open(tmp, _CREATE, 0o600)
                    try:
                        _copy_fd(src, dst)
                        os.fchmod(dst, want.mode)
                        os.utime(dst, ns=(want.mtime_ns, want.mtime_ns))
                    finally:
                        os.close(dst)
                    os.replace(tmp, target)
            finally:
                os.close(src)
        with acting_as(self.who):
            # Last: putting the files back changed their directories' mtimes.
            for path, want in snap.entries.items():
                if want.kind == "d" and want.mtime_ns:
                    os.utime(self.workdir / path, ns=(want.mtime_ns, want.mtime_ns), follow_symlinks=False)
        shutil.rmtree(scratch, ignore_errors=True)

    def _put_back(self, snap: FsSnapshot, current: dict[str, Entry]) -> None:
        # Entries created after the checkpoint go, deepest first.
        for path in sorted(current, key=lambda p: p.count("/"), reverse=True):
            want = snap.entries.get(path)
            have = current[path]
            if want is not None and want.kind == have.kind:
                continue
            target = self.workdir / path
            if have.kind == "d":
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
        for path, want in sorted(snap.entries.items()):
            target = self.workdir / path
            if want.kind == "d":
                target.mkdir(exist_ok=True)
                os.chmod(target, want.mode)
            elif want.kind == "l" and (not target.is_symlink() or os.readlink(target) != want.target):
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
                os.symlink(want.target, target)
