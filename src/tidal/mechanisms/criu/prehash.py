"""Hashing page files while CRIU is still writing them.

CRIU dumps a process on one core; the commit then hashes every chunk of the images (sha256, ~1.7 GB/s
per core on the reference machine), and for a migration that hashing is downtime. CRIU only appends to
``pages-N.img`` and ``pagemap-N.img``, so a chunk whose bytes are all written no longer changes: a thread
follows the pagemap as it grows, cuts the page file into the same chunks the commit will (one per
virtual-address window, see :mod:`~tidal.mechanisms.criu.images`) and hashes each one as soon as it is
complete. The commit takes these digests for the chunks it cuts the same way and hashes only the rest.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from tidal.mechanisms.criu.images import HEADER, PAGEMAP, PageWindows, read_entries
from tidal.mechanisms.criu.priority import yield_cpu
from tidal.mechanisms.storage.chunks import plan


class _PageFile:
    """What is known of one pagemap and its page file so far."""

    def __init__(self, pagemap: Path) -> None:
        self.pagemap = pagemap
        self.pos = HEADER  # next unread pagemap entry
        self.windows = PageWindows()
        self.hashed_to = 0  # every chunk below this offset is hashed

    @property
    def pages(self) -> Path | None:
        pid = self.windows.pages_id
        return None if pid is None else self.pagemap.with_name(f"pages-{pid}.img")

    def read_entries(self) -> None:
        """Take in the entries written since the last call."""
        try:
            with open(self.pagemap, "rb") as f:
                f.seek(self.pos)
                entries, used = read_entries(f.read(), 0)
        except OSError:
            return
        self.pos += used
        for entry in entries:
            self.windows.add(entry)


class PreHash:
    """Follows the CRIU dumps going on under ``root``; :meth:`stop` gives what it hashed:
    page file path → {(offset, length): sha256 hex digest}."""

    def __init__(self, root: Path, chunk_size: int, *, background: bool = False) -> None:
        """``background``: the commit it prepares is off the job's pause (:mod:`.priority`)."""
        self.root = root
        self.background = background
        self.chunk_size = chunk_size
        self._files: dict[Path, _PageFile] = {}
        self._digests: dict[Path, dict[tuple[int, int], str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tidal-prehash", daemon=True)
        self._thread.start()

    def stop(self) -> dict[Path, dict[tuple[int, int], str]]:
        self._stop.set()
        self._thread.join()
        return self._digests

    def _run(self) -> None:
        if self.background:
            yield_cpu()
        while not self._stop.is_set():
            if not self._step():
                self._stop.wait(0.01)

    def _step(self) -> bool:
        """Hash what became complete; whether anything was."""
        for pagemap in self.root.glob("*/pagemap-*.img"):
            if pagemap not in self._files and PAGEMAP.fullmatch(pagemap.name):
                self._files[pagemap] = _PageFile(pagemap)
        did = False
        for pf in self._files.values():
            if self._stop.is_set():
                break
            pf.read_entries()
            starts = list(pf.windows.starts.values())
            if pf.pages is None or len(starts) < 2:
                continue
            try:
                written = os.stat(pf.pages).st_size
            except OSError:
                continue
            # A window is complete once the next one has begun and the page file holds it.
            end = max((s for s in starts if s <= written), default=0)
            if end <= pf.hashed_to:
                continue
            cuts = [s for s in starts if pf.hashed_to < s < end]
            did |= self._hash(pf, pf.hashed_to, end, cuts)
        return did

    def _hash(self, pf: _PageFile, start: int, end: int, cuts: list[int]) -> bool:
        pages = pf.pages
        assert pages is not None
        digests = self._digests.setdefault(pages, {})
        try:
            fd = os.open(pages, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        buf = bytearray(self.chunk_size)
        try:
            for off, n in plan(end - start, [c - start for c in cuts], self.chunk_size):
                if self._stop.is_set():
                    return True
                view = memoryview(buf)[:n]
                if os.preadv(fd, [view], start + off) != n:
                    return True  # shorter than it said: leave the rest to the commit
                digests[(start + off, n)] = hashlib.sha256(view).hexdigest()
                view.release()
                pf.hashed_to = start + off + n
        finally:
            os.close(fd)
        return True
