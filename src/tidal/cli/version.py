"""``tidal --version``: the installed distribution's version, read from its metadata file.

:func:`importlib.metadata.version` reads the same file, but its import takes longer than the rest of `tidal
--version`: the file is looked for as it looks (the first ``tidal-*.dist-info`` or ``tidal-*.egg-info`` along
``sys.path``), and it is asked only where none is found."""

from __future__ import annotations

import os
import sys


def tidal_version() -> str:
    found = _from_metadata_file()
    if found is not None:
        return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tidal")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _from_metadata_file() -> str | None:
    for entry in sys.path:
        root = entry or "."
        try:
            names = os.listdir(root)
        except OSError:  # not a directory (a zip), or gone
            continue
        # In a directory, a .dist-info before an .egg-info, as importlib.metadata takes them.
        for kind, file in (("dist-info", "METADATA"), ("egg-info", "PKG-INFO")):
            for name in names:
                stem, _, suffix = name.rpartition(".")
                if suffix == kind and stem.partition("-")[0].lower() == "tidal":
                    return _version_in(os.path.join(root, name, file))
    return None


def _version_in(path: str) -> str | None:
    """The ``Version:`` header of a metadata file (None: it has none, or cannot be read; importlib.metadata
    tells then)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip()
                if not line.strip():  # the headers end: the description follows
                    return None
    except OSError:
        pass
    return None
