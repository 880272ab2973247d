"""Reading ``scontrol -o show``: one record per line, as space-separated ``Key=Value`` fields."""

from __future__ import annotations

import contextlib
import re
import subprocess

_FIELD = re.compile(r"(\w[\w:/]*)=(\S*)")  # keys such as TRES/gres:gpu too


def fields(line: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one ``scontrol -o show`` record (a value ends at the next space: one with
    spaces, such as ``Command=``, keeps its first word)."""
    return {m.group(1): m.group(2) for m in _FIELD.finditer(line)}


def show(kind: str, name: str, timeout: float = 30.0) -> dict[str, str]:
    """``scontrol -o show KIND NAME``'s fields; empty where scontrol is missing, fails or does not know it
    (the callers then fall back to what they can find without Slurm)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["scontrol", "-o", "show", kind, name], capture_output=True, text=True,
                             timeout=timeout, check=False)
        if out.returncode == 0:
            return fields(out.stdout.splitlines()[0]) if out.stdout.strip() else {}
    return {}
