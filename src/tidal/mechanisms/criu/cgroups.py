"""The cgroup v1 controllers a rank lives in: the freezer holds it still across a dump."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tidal.errors import MechanismError

ROOT = Path(os.environ.get("TIDAL_CGROUP_ROOT", "/sys/fs/cgroup"))


def freezer_available() -> bool:
    return (ROOT / "freezer" / "cgroup.procs").exists()


class Freezer:
    """One freezer cgroup per rank incarnation: ``/sys/fs/cgroup/freezer/tidal/<node>/<rank>``."""

    def __init__(self, *parts: str) -> None:
        self.path = ROOT.joinpath("freezer", "tidal", *parts)

    def create(self) -> None:
        if self.path.exists():
            # A left-over from a killed incarnation: it must be empty, else two copies would mix.
            if self.procs():
                raise MechanismError(f"freezer cgroup {self.path} still holds processes {self.procs()}",
                                     hint="another copy of this rank is running on this node")
            self.thaw()
        else:
            self.path.mkdir(parents=True)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def procs(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def state(self) -> str:
        return (self.path / "freezer.state").read_text().strip()

    def freeze(self, timeout: float = 10.0) -> None:
        (self.path / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + timeout
        while self.state() != "FROZEN":
            if time.monotonic() > deadline:
                self.thaw()
                raise MechanismError(f"rank did not freeze within {timeout:.0f}s ({self.path})",
                                     hint="a process of the rank may be stuck in uninterruptible sleep")
            time.sleep(0.001)

    def thaw(self) -> None:
        (self.path / "freezer.state").write_text("THAWED")

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            # Still has processes (exiting): leave it; `create` checks emptiness before reuse.
            pass
