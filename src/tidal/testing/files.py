"""Directories for tests whose processes run as other accounts."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def shared_dir(prefix: str = "tidal-test-") -> Iterator[Path]:
    """A new directory under /tmp that every account may traverse (mode 0755; pytest's temporary
    directories are root's alone), removed with all it holds on leaving."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        d.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def owned_dir(path: Path, unix_user: str) -> Path:
    """Make directory ``path`` (its parent must exist) owned by ``unix_user`` and that account's group."""
    pw = pwd.getpwnam(unix_user)
    path.mkdir()
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return path
