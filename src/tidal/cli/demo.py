"""``tidal demo``: a training job is checkpointed, killed, restored on another node, and finishes with
exactly the output of an uninterrupted run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.table import Table

from tidal.cli.output import console
from tidal.config import load_settings
from tidal.errors import ConfigError, TidalError
from tidal.mechanisms.criu.provision import checkout_root


def _train_script() -> Path:
    root = checkout_root()
    script = root / "examples" / "train.py" if root else None
    if script is None or not script.is_file():
        raise ConfigError("the demo needs examples/train.py from the Tidal source checkout",
                          hint="run `make demo` in the checkout")
    return script


def _wait_for_step(log: Path, step: int, timeout: float = 120) -> None:
    rx = re.compile(rf"^step {step} ", re.M)
    deadline = time.monotonic() + timeout
    while not (log.exists() and rx.search(log.read_text(errors="replace"))):
        if time.monotonic() > deadline:
            raise TidalError(f"the demo job did not reach step {step} within {timeout:.0f}s: see {log}")
        time.sleep(0.02)


def run_demo(steps: int = 60, keep: bool = False) -> bool:
    from tidal.mechanisms.criu.job import Job
    from tidal.mechanisms.criu.rank import Node, RankSpec, become_subreaper
    from tidal.mechanisms.storage import CheckpointStore

    if os.geteuid() != 0:
        raise ConfigError("the demo runs ranks in their own PID namespaces and needs root",
                          hint="run it as root (sudo make demo)")
    settings = load_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="demo-", dir=settings.home))
    become_subreaper()
    script = _train_script()
    argv = (sys.executable, str(script), "--steps", str(steps), "--step-time", "0.03")
    workdir, refdir = base / "work", base / "reference"
    workdir.mkdir()
    refdir.mkdir()
    env = {k: v for k, v in os.environ.items()}
    nodes = [Node(f"node-{i}", base / f"node-{i}") for i in (1, 2)]
    store = CheckpointStore(str(base / "checkpoints"))
    spec = RankSpec("demo", 0, argv, workdir, env)

    console.print(f"[bold]Tidal demo[/] — state in {base}")
    console.print(f"1. Reference: [cyan]{script.name}[/] runs {steps} steps uninterrupted …")
    ref = subprocess.run(argv, cwd=refdir, env=spec.launch_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=True).stdout
    rows = []
    job = Job.launch("demo", [(spec, nodes[0])], store)
    console.print(f"2. The same job starts on [green]{nodes[0].name}[/] (pid {job.ranks[0].pid})")
    rows.append(("launch", nodes[0].name, str(job.ranks[0].pid), "", ""))
    for i, stop in enumerate((steps // 4, steps // 2)):
        here = job.ranks[0].node
        there = nodes[(i + 1) % 2]
        _wait_for_step(here.log_path(spec), stop)
        info = job.checkpoint(then="kill")
        t = job.last_timing
        console.print(f"{3 + 2 * i}. At step {stop}: checkpoint {info.id} ({info.logical_bytes / 2**20:.0f} MiB "
                      f"image, {info.stored_bytes / 2**20:.1f} MiB new in the store, paused "
                      f"{t.pause_s if t else 0:.2f}s), then the job is killed on {here.name}")
        rows.append((f"checkpoint at step {stop}", here.name, "", info.id, f"{info.stored_bytes / 2**20:.1f} MiB"))
        started = time.perf_counter()
        job = Job.restore(store, "demo", [(spec, there)])
        console.print(f"{4 + 2 * i}. Restored on [green]{there.name}[/] (pid {job.ranks[0].pid}) in "
                      f"{time.perf_counter() - started:.2f}s; it goes on from step {stop + 1}")
        rows.append(("restore", there.name, str(job.ranks[0].pid), info.id, ""))
    [status] = job.wait(600)
    out = job.ranks[0].node.log_path(spec).read_bytes()
    same_log = out == ref
    same_params = (workdir / "params.bin").read_bytes() == (refdir / "params.bin").read_bytes()
    table = Table(title="What happened")
    for col in ("event", "node", "pid", "checkpoint", "stored"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    table.add_row("finished", job.ranks[0].node.name, "", "", str(status))
    console.print(table)
    verdict = "[bold green]identical[/]" if same_log else "[bold red]DIFFERENT[/]"
    console.print(f"Per-step output vs the uninterrupted run: {verdict} ({len(out.splitlines())} lines); "
                  f"final parameters: {'[bold green]identical[/]' if same_params else '[bold red]DIFFERENT[/]'}")
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return same_log and same_params and status.ok


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        steps: int = typer.Option(60, help="training steps of the demo job"),
        keep: bool = typer.Option(False, help="keep the demo's state directory"),
    ) -> None:
        """Show a job being checkpointed, killed, restored on another node and finishing identically."""
        if not run_demo(steps, keep):
            raise typer.Exit(1)
