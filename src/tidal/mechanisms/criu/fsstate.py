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
from tidal.mechanisms.permissions import private_dir


@dataclass(frozen=True)
class Entry:
    kind: str  # "f" file, "d" directory, "l" symlink
    mode: int
    size: int = 0
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


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    with os.scandir(root / rel if rel else root) as it:
        for de in it:
            path = f"{rel}/{de.name}" if rel else de.name
            yield path, de
            if de.is_dir(follow_symlinks=False):
                yield from _walk(root, path)


def scan(root: Path) -> dict[str, Entry]:
    """Every entry under ``root`` (not following symlinks), keyed by relative POSIX path."""
    out: dict[str, Entry] = {}
    for path, de in _walk(root):
        st = de.stat(follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            out[path] = Entry("f", mode, st.st_size, st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode):
            out[path] = Entry("d", mode)
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
    """Tracks one job's working directory against its launch-time baseline."""

    def __init__(self, workdir: Path, baseline: dict[str, Entry]) -> None:
        self.workdir = workdir
        self.baseline = baseline

    @classmethod
    def at_launch(cls, workdir: Path) -> FsTracker:
        return cls(workdir, scan(workdir))

    def baseline_json(self) -> dict[str, Any]:
        return {p: asdict(e) for p, e in self.baseline.items()}

    @classmethod
    def from_json(cls, workdir: Path, data: dict[str, Any]) -> FsTracker:
        return cls(workdir, {p: Entry(**e) for p, e in data.items()})

    def capture(self, staging: Path) -> FsSnapshot:
        """Record the directory now and copy changed files into ``staging`` (call while the job is frozen)."""
        if not self.workdir.is_dir():
            raise CheckpointError(f"working directory {self.workdir} has disappeared", object=str(self.workdir))
        entries = scan(self.workdir)
        captured = []
        for path, entry in entries.items():
            if entry.kind != "f":
                continue
            base = self.baseline.get(path)
            if base is not None and base.same_content_as(entry):
                continue
            dest = staging / path
            private_dir(dest.parent)
            shutil.copyfile(self.workdir / path, dest)  # copy_file_range/sendfile: in-kernel
            os.chmod(dest, 0o600)
            captured.append(path)
        return FsSnapshot(entries, captured)

    def restore(self, snap: FsSnapshot, fetch: Callable[[list[str], Path], None], scratch: Path) -> None:
        """Put the working directory back as in ``snap``. ``fetch(paths, into)`` writes the captured files
        of ``paths`` under ``into`` (verified); nothing in the working directory changes unless all of them
        arrived and every input is intact."""
        if not self.workdir.is_dir():
            raise CheckpointError(f"cannot restore: working directory {self.workdir} does not exist on this "
                                  "node", object=str(self.workdir),
                                  hint="the working directory must exist at the same path on every node")
        current = scan(self.workdir)
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
        for path in snap.captured:
            want = snap.entries[path]
            target = self.workdir / path
            # Next to the target, then renamed: atomic per file, whatever file system scratch is on.
            tmp = target.with_name(f".{target.name}.tidal-restore")
            shutil.copyfile(scratch / path, tmp)
            os.chmod(tmp, want.mode)
            os.utime(tmp, ns=(want.mtime_ns, want.mtime_ns))
            os.replace(tmp, target)
        shutil.rmtree(scratch, ignore_errors=True)
