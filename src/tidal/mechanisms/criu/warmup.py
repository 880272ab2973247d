"""Memory for a dump, made ready while the job still runs.

CRIU writes a frozen rank's memory into Tidal's large-page tmpfs, so how fast the kernel hands it large
pages is part of the pause. Large pages the machine has not used for a while are the slowest to get: a
virtual machine that reports free memory to its host (virtio-balloon free page reporting, which reports
free blocks of large-page size) faults each one in again. A job's next dump normally goes into the memory
of its last one, freed just before (:mod:`~tidal.mechanisms.criu.lastdump`). A job without a last dump
in large pages (its first checkpoint, or its first since a restore) can get the same here: before the cut,
a file as large as the dump is written in the dump's staging area, while the ranks still run, and removed
right before CRIU writes; its pages are the ones CRIU's images then go into. That delays the cut by the
time the writing takes (seconds per GiB of fresh pages), so only a move after a pre-copy asks for it
(``Job.checkpoint(warm=True)``): its job has just run on through a copy between regions, and its
standstill is what the move is judged by.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

BLOCK = 8 << 20  # bytes written at a time


class Warmup:
    """``nbytes`` of the file system of ``directory`` made ready, until :meth:`release`."""

    def __init__(self, directory: Path, nbytes: int) -> None:
        self.path: Path | None = directory / ".warmup"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            zeros = bytes(BLOCK)
            left = nbytes
            while left > 0:
                # Written, not fallocated: tmpfs leaves fallocated pages untouched until they are used.
                left -= os.write(fd, zeros[:min(left, BLOCK)])
        except OSError:
            self.release()  # a full staging area: the dump goes on without (and says so itself if it fails)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the memory back, for the dump that follows at once (idempotent)."""
        path, self.path = self.path, None
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
