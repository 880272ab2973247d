"""The images of a rank's last committed dump, kept beside the staging area until its next dump.

They serve the next checkpoint of the same process in one of two ways (see ``Job.compare_last``):

* as a comparison base: a chunk whose bytes are unchanged takes its committed digest instead of being
  hashed again (a memcmp instead of a sha256 over memory that did not change);
* as memory to write the next dump into: removed right before CRIU dumps, their pages are what the
  kernel hands CRIU. Memory freed long before is slower to fill on a virtual machine that returns free
  pages to its host (virtio-balloon free page reporting): each page faults in the host again.

The files are Tidal's own private copies; a file whose stat changed since it was committed is not used.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from tidal.mechanisms.criu.discard import discard
from tidal.mechanisms.criu.images import page_file_windows
from tidal.mechanisms.criu.memory import mem_available
from tidal.mechanisms.storage import Entry


def _sig(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class _Kept:
    entry: Entry
    sig: tuple[int, int, int]
    windows: dict[int, int]  # virtual-address window -> file offset (page files only)


class LastDump:
    def __init__(self) -> None:
        self.dir: Path | None = None
        self.large_pages = False
        self._files: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def previous(self, name: str) -> tuple[Path, Entry] | None:
        kept = self._files.get(name)
        if self.dir is None or kept is None:
            return None
        path = self.dir / name
        try:
            if _sig(path) != kept.sig:
                return None
        except OSError:
            return None
        return path, kept.entry

    @property
    def nbytes(self) -> int:
        """The size of the images kept."""
        return sum(k.entry.size for k in self._files.values())

    def moved(self, name: str, windows: dict[int, int]) -> dict[int, int]:
        """For a new page file with ``windows``: new chunk offset → offset of the same window here."""
        kept = self._files.get(name)
        if kept is None:
            return {}
        return {off: kept.windows[w] for w, off in windows.items() if w in kept.windows}

    def keep(self, images: Path, entries: dict[str, Entry], where: Path, *, large_pages: bool = False,
             windows: dict[str, dict[int, int]] | None = None) -> None:
        """Take over ``images`` (committed as ``entries``) by renaming it to ``where``. Not when memory is
        short: the images may sit in tmpfs, and reuse is only a speed-up. ``large_pages``: they sit in
        large pages, which the kernel frees in milliseconds (4 KiB pages: a few tenths of a second per
        GB). ``windows``: their :func:`page_file_windows`, where the caller has them already."""
        windows = page_file_windows(images) if windows is None else windows
        self.drop()
        size = sum(f.stat().st_size for f in images.iterdir() if f.is_file())
        if mem_available() < size + (2 << 30):
            return
        try:
            discard(where)
            images.rename(where)
        except OSError:
            return  # another file system: simply no reuse next time
        self.dir = where
        self.large_pages = large_pages
        self._files = {}
        for name, entry in entries.items():
            with contextlib.suppress(OSError):
                self._files[name] = _Kept(entry, _sig(where / name), windows.get(name, {}))

    def drop(self, *, now: bool = False) -> None:
        """Forget the images and remove them, in the background unless ``now``."""
        # Taken in one step: a job's waiter and its killer may drop at the same time.
        with self._lock:
            gone, self.dir, self._files = self.dir, None, {}
        if gone is not None:
            discard(gone, parent_too=True, now=now)
