#!/usr/bin/env python3
"""How long a `tidal` command takes, start-up included: `tidal --version`, `tidal --help`, and against a local
cluster `tidal ls` (into a pipe, and as on a terminal: a rich table), `tidal show JOB`, `tidal submit` (a job
that waits: `sleep`, behind the first) and `tidal cancel JOB`; against `python -c pass` and `python -c "import
typer"` in the same run. Targets (docs/cluster.md, "CLI start-up"): `tidal --version` ≤ 0.15 s and `tidal ls`
≤ 0.3 s on a quiet machine.

    python benchmarks/cli_startup.py [--runs 20] [--json FILE] [--compare OTHER/src]

The cluster is started here (`tidal up --nodes 1` in a scratch TIDAL_HOME) and stopped at the end; with
TIDAL_URL (and TIDAL_TOKEN) set, that control plane is used instead. The commands are run as
`python -m tidal.cli.main ...` with this environment, so PYTHONPATH chooses the tree measured (the `tidal`
script starts the same module); `--compare OTHER/src` measures another tree's in the same rounds, for a before
and after on the same machine at the same time. The runs of all commands are interleaved, round after round,
so that they all see the same machine. Prints a table (the median and fastest run's wall-clock time, the
median CPU time (user + system) of the process, which a busy machine's other work hardly changes, the median
over `python -c pass`'s, and the modules each imports, with the heavy ones among them) and writes JSON.
Timings are never asserted in tests: tests/unit/cli/test_startup.py and tests/integration/cli/test_startup.py
hold what each command may import.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import BenchmarkError, run, say, write_json
from tidal.testing.imports import imports_of

TIDAL = [sys.executable, "-m", "tidal.cli.main"]
# Imports a short command should not need, reported where a command makes them (a package: any of its modules).
HEAVY = ("typer", "rich", "pydantic", "httpx", "yaml", "sqlalchemy", "fastapi", "pydantic_settings", "tidal.core",
         "tidal.config", "tidal.control.api", "prometheus_client")
TARGETS_S = {"tidal --version": 0.15, "tidal ls": 0.3}


def machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release(),
            "python": platform.python_version(), "load_average_at_start": os.getloadavg()}


def tidal(env: dict[str, str], *args: str) -> str:
    p = subprocess.run([*TIDAL, *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    if p.returncode != 0:
        raise BenchmarkError(f"tidal {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-1500:]}",
                             hint="does `tidal up` work here? see TIDAL_HOME/logs")
    return p.stdout


@contextmanager
def cluster(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The environment of commands against a control plane: TIDAL_URL's, else a local cluster's of one node."""
    if env.get("TIDAL_URL"):
        say(f"using the control plane at {env['TIDAL_URL']}")
        yield env
        return
    home = tempfile.mkdtemp(prefix="tidal-cli-bench-")
    local = {**env, "TIDAL_HOME": home}
    say(f"starting a local cluster (tidal up --nodes 1) in {home}")
    tidal(local, "up", "--nodes", "1")
    try:
        yield local
    except BaseException:
        say(f"the local cluster's logs are kept in {home}/logs")
        raise
    else:
        shutil.rmtree(home, ignore_errors=True)
    finally:
        tidal(local, "down")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """``argv`` run to its end: its wall-clock and CPU seconds (user + system), and how it ended."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # of the children waited for: this one alone, next
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, p


def imported(argv: list[str], env: dict[str, str]) -> set[str]:
    """The modules ``argv`` (a Python command line: ``-c CODE`` or ``-m tidal.cli.main ARGS``) imports."""
    if argv[1] == "-m":
        return imports_of(argv[2], *argv[3:], env=env)
    return _code_imports(argv[2], env)


def _code_imports(code: str, env: dict[str, str]) -> set[str]:
    p = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"], env=env,
                       capture_output=True, text=True, timeout=300, check=True)
    return set(p.stdout.split())


def heavy(modules: set[str]) -> list[str]:
    return [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs of each command (default 20)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--compare", type=Path, metavar="SRC",
                    help="also measure the tidal of another tree: SRC, its src directory (an older checkout's)")
    ap.add_argument("--compare-label", default="[compare]", help="its rows' label (default [compare])")
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_") or k in ("TIDAL_URL", "TIDAL_TOKEN")}
    # Into a pipe, plainly: no colour forced, no terminal pretended (but where a row says so).
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        base.pop(var, None)
    out: dict[str, Any] = {"machine": machine(), "runs": args.runs, "targets_s": TARGETS_S}
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    modules: dict[str, set[str]] = {}
    with cluster(base) as env, tempfile.TemporaryDirectory(prefix="tidal-cli-bench-work-") as workdir:
        first = tidal(env, "submit", "-q", "--name", "bench-show", "--", "sleep", "3600").strip()
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            'python -c "import typer"': ([sys.executable, "-c", "import typer"], env),
        }
        # This tree's commands, and those of the tree --compare names (its src on PYTHONPATH), round after round.
        trees = [("", env)]
        if args.compare:
            trees.append((f"{args.compare_label} ", {**env, "PYTHONPATH": str(args.compare)}))
        for label, tree in trees:
            commands |= {
                f"{label}tidal --version": ([*TIDAL, "--version"], tree),
                f"{label}tidal --help": ([*TIDAL, "--help"], tree),
                f"{label}tidal ls": ([*TIDAL, "ls"], tree),
                f"{label}tidal ls (terminal)": ([*TIDAL, "ls"], {**tree, "TTY_COMPATIBLE": "1", "COLUMNS": "120"}),
                f"{label}tidal show JOB": ([*TIDAL, "show", first], tree),
                f"{label}tidal submit": ([*TIDAL, "submit", "-q", "--workdir", workdir, "--", "sleep", "3600"], tree),
                f"{label}tidal cancel JOB": ([*TIDAL, "cancel"], tree),  # + the job its submit made this round
            }
        say(f"{args.runs} rounds of {len(commands)} commands")
        submitted = ""
        for _ in range(args.runs):
            for name, (argv, cmd_env) in commands.items():
                if name.endswith("tidal cancel JOB"):
                    argv = [*argv, submitted]
                wall, used, p = timed(argv, cmd_env)
                times.setdefault(name, []).append(wall)
                cpu.setdefault(name, []).append(used)
                if p.returncode != 0:
                    raise BenchmarkError(f"{name} failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
                if name.endswith("tidal submit"):
                    submitted = p.stdout.strip()
        for name, (argv, cmd_env) in commands.items():
            if name.endswith("tidal cancel JOB"):
                argv = [*argv, tidal(env, "submit", "-q", "--workdir", workdir, "--", "sleep", "3600").strip()]
            modules[name] = imported(argv, cmd_env)
        tidal(env, "cancel", first)
    out["machine"]["load_average_at_end"] = os.getloadavg()
    python = statistics.median(times["python -c pass"])
    rows = []
    for name, ts in times.items():
        row = {"command": name, "median_s": statistics.median(ts), "min_s": min(ts),
               "cpu_median_s": statistics.median(cpu[name]), "over_python": statistics.median(ts) / python,
               "modules": len(modules[name]), "heavy": heavy(modules[name])}
        target = TARGETS_S.get(name)  # this tree's rows
        if target is not None:
            row["target_s"] = target
            row["met"] = row["median_s"] <= target
        rows.append(row)
    out["results"] = rows
    m = out["machine"]
    print(f"{m['cpu']}, {m['cores']} cores, Python {m['python']}; load average {m['load_average_at_start'][0]:.2f} "
          f"at the start, {m['load_average_at_end'][0]:.2f} at the end; {args.runs} runs each")
    print(f"{'command':30s} {'median':>7s} {'min':>7s} {'CPU':>7s} {'×python':>7s} {'modules':>7s}  "
          f"{'target':12s} heavy imports")
    for r in rows:
        target = f"≤ {r['target_s']:.2f} s {'✔' if r['met'] else '✘'}" if "target_s" in r else "-"
        print(f"{r['command'][:30]:30s} {r['median_s'] * 1000:5.0f}ms {r['min_s'] * 1000:5.0f}ms "
              f"{r['cpu_median_s'] * 1000:5.0f}ms {r['over_python']:7.1f} {r['modules']:7d}  {target:12s} "
              f"{', '.join(r['heavy']) or '-'}")
    write_json(args.json, out)


if __name__ == "__main__":
    run(main)
