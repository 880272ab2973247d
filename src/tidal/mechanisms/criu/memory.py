"""How much memory the machine can still give: in-memory staging (tmpfs) competes with the jobs."""

from __future__ import annotations

from pathlib import Path


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
