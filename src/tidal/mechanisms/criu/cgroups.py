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

    def freeze(self, timeout: float = 20.0, attempts: int = 4) -> None:
        """Freeze every task. A task in a sleep the freezer cannot interrupt (writeback throttling on a busy
        disk, the middle of an exit) holds the cgroup in FREEZING: thaw, let it get past, try again."""
        per_try = timeout / attempts
        for attempt in range(attempts):
            (self.path / "freezer.state").write_text("FROZEN")
            deadline = time.monotonic() + per_try
            while self.state() != "FROZEN":
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            else:
                return
            stuck = self._unfrozen()
            self.thaw()
            if attempt < attempts - 1:
                time.sleep(0.1 * (attempt + 1))
        raise MechanismError(f"rank did not freeze within {timeout:.0f}s ({self.path}); not frozen: {stuck}",
                             hint="a process of the rank is stuck in uninterruptible sleep")

    def _unfrozen(self) -> str:
        """The tasks not (yet) in the refrigerator, with their state and kernel wait channel."""
        out = []
        for pid in self.procs():
            try:
                wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if "refrigerator" in wchan or "freezer" in wchan:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state = stat[stat.rindex(")") + 2]
            out.append(f"{pid} {comm} {state} {wchan or '-'}")
        return "; ".join(out) or "none listed"

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
