"""Turns taken across the processes of one machine: an exclusive ``flock`` on an owner-only lock file."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def machine_lock(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock (the file is created, mode 0600, if missing) until the block ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
