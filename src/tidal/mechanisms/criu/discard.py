"""Removing scratch directories off the critical path.

Freeing a GB of images in tmpfs takes the kernel a few tenths of a second; a checkpoint or a restore need
not wait for it. :func:`discard` moves the directory into ``.discarded/`` two levels up (on the same file
system: the staging root of the node's staging area), so that its name and its parent are free at once,
and removes it in a background thread. The threads are not daemons: the interpreter waits for them at
exit, so nothing is left behind in memory-backed ``/dev/shm``; what a killed process left there is
removed by the next :meth:`NodeRoot.clear_staging`.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from pathlib import Path

from tidal.mechanisms.permissions import private_dir

TRASH = ".discarded"
_pending: list[threading.Thread] = []
_lock = threading.Lock()


def trash_of(area: Path) -> Path:
    """Where directories of ``area`` (a node's staging area) go when discarded."""
    return area.parent / TRASH


def discard(path: Path, *, parent_too: bool = False, now: bool = False) -> None:
    """Remove ``path`` (a directory) in the background, or before returning with ``now``; ``parent_too``:
    its parent too, if left empty."""
    if now:
        shutil.rmtree(path, ignore_errors=True)
        if parent_too:
            with contextlib.suppress(OSError):
                path.parent.rmdir()
        return
    target = private_dir(trash_of(path.parent)) / f"{path.name}-{uuid.uuid4().hex[:8]}"
    trash: Path | None = target
    try:
        path.rename(target)
    except OSError:
        # Gone already, or it cannot move: then it is removed under its own name.
        trash = path if path.exists() else None
    if parent_too and trash is not path:
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only once nothing of it is left
    if trash is None:
        return
    t = threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True}, name="tidal-discard")
    with _lock:
        _pending[:] = [p for p in _pending if p.is_alive()]
        _pending.append(t)
    t.start()


def empty_trash(area: Path) -> None:
    """Remove what was discarded from ``area``'s staging root and not removed yet (its remover was
    killed). Other areas' removals running meanwhile do not mind."""
    with contextlib.suppress(OSError):
        for p in trash_of(area).iterdir():
            shutil.rmtree(p, ignore_errors=True)


def wait_discarded(timeout: float | None = None) -> None:
    """Wait until every directory discarded so far is gone."""
    with _lock:
        pending = list(_pending)
    for t in pending:
        t.join(timeout)
