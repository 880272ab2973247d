"""Owner-only directories: checkpoint images and rank logs hold process memory and output."""

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
