"""Owner-only files and directories: checkpoint images and rank logs hold process memory and output, key
and credential files hold secrets."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path, *, below: Path | None = None) -> Path:
    """Create ``path`` (and missing parents below ``below``) with mode 0700, whatever the umask."""
    missing = []
    p = path
    while not p.exists() and p != p.parent and (below is None or p != below):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read, whatever the umask, atomically (a crash leaves the old one or the
    new one, never a part)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
