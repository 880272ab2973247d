"""The checkpoint mechanism alone, on this machine and without a control plane (``tidal demo --mechanism``):
a training script checkpointed at a step, killed, and restored under another node root, twice, finishing with
exactly the output and parameters of an uninterrupted run.

Also what every demo needs: a fresh state directory (ranks run in PID namespaces: root only), the example
scripts of the source checkout, and waiting for a condition with a deadline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tidal.errors import ConfigError
from tidal.mechanisms.criu.provision import checkout_root
from tidal.waiting import wait_until

if TYPE_CHECKING:
    from tidal.mechanisms.criu.rank import ExitStatus

T = TypeVar("T")


def example_script(name: str) -> Path:
    """``examples/NAME`` of the Tidal source checkout this package runs from."""
    root = checkout_root()
    script = root / "examples" / name if root else None
    if script is None or not script.is_file():
        raise ConfigError(f"the demo needs examples/{name} from the Tidal source checkout",
                          hint="run `make demo` in the checkout")
    return script


def until(what: str, check: Callable[[], T | None], timeout: float = 120) -> T:
    """Poll ``check`` until it returns something true, and return that; raise after ``timeout`` seconds."""
    return wait_until(check, timeout=timeout, what=what, interval=0.1,
                      hint="run it again with --keep and look at the logs in its state directory; a busy machine "
                           "may need fewer --steps")


def demo_dir(home: Path, prefix: str) -> Path:
    """A fresh directory for one demo run under ``home`` (root is needed for the ranks' namespaces)."""
    if os.geteuid() != 0:
        raise ConfigError("the demo runs ranks in their own PID namespaces and needs root",
                          hint="run it as root (sudo make demo)")
    home.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=home))


def _log_has_step(log: Path, step: int) -> bool:
    return log.exists() and re.search(rf"^step {step} ", log.read_text(errors="replace"), re.M) is not None


@dataclass
class MechanismDemo:
    """What the mechanism demo did: one row per launch, checkpoint and restore (event, node, pid,
    checkpoint, stored), and whether the run ended like the uninterrupted one."""

    base: Path
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    finished_on: str = ""
    status: ExitStatus | None = None
    lines: int = 0
    same_log: bool = False
    same_params: bool = False

    @property
    def ok(self) -> bool:
        return self.same_log and self.same_params and self.status is not None and self.status.ok


def run_mechanism_demo(home: Path, steps: int = 60, keep: bool = False,
                       say: Callable[[str], None] = print) -> MechanismDemo:
    """Run ``examples/train.py`` for ``steps`` steps uninterrupted, then again as a rank that is
    checkpointed and moved between two node roots twice; ``say`` tells each step as it happens."""
    from tidal.mechanisms.criu.job import Job
    from tidal.mechanisms.criu.rank import NodeRoot, RankSpec, become_subreaper
    from tidal.mechanisms.storage import CheckpointStore

    base = demo_dir(home, "demo-")
    become_subreaper()
    script = example_script("train.py")
    argv = (sys.executable, str(script), "--steps", str(steps), "--step-time", "0.03")
    workdir, refdir = base / "work", base / "reference"
    workdir.mkdir()
    refdir.mkdir()
    env = dict(os.environ)
    nodes = [NodeRoot(f"node-{i}", base / f"node-{i}") for i in (1, 2)]
    store = CheckpointStore(str(base / "checkpoints"))
    spec = RankSpec("demo", 0, argv, workdir, env)
    result = MechanismDemo(base)

    say(f"1. Reference: {script.name} runs {steps} steps uninterrupted …")
    ref = subprocess.run(argv, cwd=refdir, env=spec.launch_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=True).stdout
    job = Job.launch("demo", [(spec, nodes[0])], store)
    say(f"2. The same job starts on {nodes[0].name} (pid {job.ranks[0].pid})")
    result.rows.append(("launch", nodes[0].name, str(job.ranks[0].pid), "", ""))
    for i, stop in enumerate((steps // 4, steps // 2)):
        here = job.ranks[0].node
        there = nodes[(i + 1) % 2]
        until(f"step {stop}", partial(_log_has_step, here.log_path(spec), stop))
        info = job.checkpoint(then="kill")
        t = job.last_timing
        say(f"{3 + 2 * i}. At step {stop}: checkpoint {info.id} ({info.logical_bytes / 2**20:.0f} MiB image, "
            f"{info.stored_bytes / 2**20:.1f} MiB new in the store, paused {t.pause_s if t else 0:.2f}s), "
            f"then the job is killed on {here.name}")
        result.rows.append((f"checkpoint at step {stop}", here.name, "", info.id,
                            f"{info.stored_bytes / 2**20:.1f} MiB"))
        started = time.perf_counter()
        job = Job.restore(store, "demo", [(spec, there)])
        say(f"{4 + 2 * i}. Restored on {there.name} (pid {job.ranks[0].pid}) in "
            f"{time.perf_counter() - started:.2f}s; it goes on from step {stop + 1}")
        result.rows.append(("restore", there.name, str(job.ranks[0].pid), info.id, ""))
    [result.status] = job.wait(600)
    out = job.ranks[0].node.log_path(spec).read_bytes()
    result.finished_on = job.ranks[0].node.name
    result.lines = len(out.splitlines())
    result.same_log = out == ref
    result.same_params = (workdir / "params.bin").read_bytes() == (refdir / "params.bin").read_bytes()
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return result
