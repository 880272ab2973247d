"""PreHash: digests of page-file chunks taken while the files are still being written equal what the
commit would compute, for the very chunks the commit cuts."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from tests.unit.mechanisms.criu.pagemaps import MAGIC, entry
from tidal.mechanisms.criu.images import PAGE, PE_PRESENT, page_file_windows, window_boundaries
from tidal.mechanisms.criu.prehash import PreHash
from tidal.mechanisms.storage.chunks import plan
from tidal.testing import wait_until

CHUNK = 256 << 10
MB = 1 << 20


def _dump_slowly(images: Path, regions: list[tuple[int, int, bool]], done: threading.Event) -> bytes:
    """Write a pagemap and its page file the way CRIU does: appended, entry by entry, a page run at a
    time."""
    pages = b""
    with open(images / "pagemap-7.img", "wb") as pm, open(images / "pages-3.img", "wb") as pf:
        pm.write(MAGIC + entry({1: 3}))
        pm.flush()
        for vaddr, nr, present in regions:
            pm.write(entry({1: vaddr, 2: nr, 4: PE_PRESENT if present else 0}))
            if present:
                data = os.urandom(nr * PAGE)
                for i in range(0, len(data), 64 * PAGE):
                    pf.write(data[i : i + 64 * PAGE])
                    pf.flush()
                    time.sleep(0.001)
                pages += data
            pm.flush()
    done.set()
    return pages


def test_prehashed_chunks_are_the_commits_chunks_with_the_same_digests(tmp_path: Path) -> None:
    images = tmp_path / "rank-0"
    images.mkdir()
    regions = [
        (0x400000, 300, True),  # 1.17 MB from a window start: spans two windows
        (0x7F0000, 40, True),  # crosses into the next window
        (0x900000, 10, False),  # not present: no pages in the file
        (0x1000000 + 5 * PAGE, 700, True),  # starts inside a window
        (0x2000000, 256, True),  # exactly one window
        (0x3000000, 100, True),  # the last window: its end is only known at the end
    ]
    pre = PreHash(tmp_path, CHUNK)
    done = threading.Event()
    pages = _dump_slowly(images, regions, done)
    size = len(pages)
    windows = page_file_windows(images)["pages-3.img"]
    chunks = plan(size, window_boundaries(windows), CHUNK)
    last_window = max(windows.values())
    complete = [(off, n) for off, n in chunks if off + n <= last_window]
    wait_until(lambda: len(pre._digests.get(images / "pages-3.img", {})) >= len(complete), timeout=30,
               what="PreHash to catch up with a finished dump", interval=0.01)
    got = pre.stop()[images / "pages-3.img"]
    assert sorted(got) == complete  # every chunk but the last window's, cut as the commit cuts them
    for (off, n), digest in got.items():
        assert digest == hashlib.sha256(pages[off : off + n]).hexdigest()


def test_stop_before_anything_is_written(tmp_path: Path) -> None:
    pre = PreHash(tmp_path, CHUNK)
    assert pre.stop() == {}
