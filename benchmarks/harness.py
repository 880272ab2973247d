"""What the benchmark scripts share: running one (errors as messages, not tracebacks), progress lines, the
machine's description, polling with a deadline, the ranks' environment, a scratch directory and the JSON
result file."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from tidal.errors import ConfigError, TidalError
from tidal.waiting import wait_until

T = TypeVar("T")

# A CPU job whose image is about ``mb`` MiB (``HOLDER.format(mb=...)``, run by ``python -c``): it holds that
# many random (incompressible) bytes and prints a step line every 50 ms, with the wall-clock time (a move's
# real standstill is the longest gap between two steps).
HOLDER = """
import os, time
blob = bytearray(os.urandom({mb} << 20))
i = 0
while True:
    i += 1
    print("step", i, blob[i % len(blob)], "t", "%.3f" % time.time(), flush=True)
    time.sleep(0.05)
"""


class BenchmarkError(TidalError):
    """A benchmark could not measure what it was run for."""


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a benchmark's ``main`` and exit with its code; a TidalError ends it with its message and hint."""
    try:
        code = main()
    except TidalError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        code = 1
    sys.exit(code or 0)


def arguments(doc: str | None, workdir: str) -> argparse.ArgumentParser:
    """The options every benchmark of ranks takes: ``--json FILE`` for the results and ``--dir`` for its work
    directory (on the disk under test), described by the first paragraph of the script's docstring."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--dir", type=Path, default=Path(workdir), help=f"work directory (default {workdir})")
    return p


def say(msg: str) -> None:
    """A progress line, on stderr (stdout is for the results)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def host_ranks() -> None:
    """Make this process fit to run Tidal ranks: root (they run in PID namespaces), and the subreaper of
    their process trees."""
    from tidal.mechanisms.criu.rank import become_subreaper

    if os.geteuid() != 0:
        raise ConfigError("the benchmark runs ranks in PID namespaces and needs root",
                          hint="run it as root, with CRIU provisioned (`make criu`)")
    become_subreaper()


def machine(with_torch: bool = False) -> dict[str, Any]:
    """The machine the figures were taken on: CPU, cores, memory, kernel, CRIU and Python (and torch, with
    the load average at the start, for the benchmarks of training jobs)."""
    from tidal.mechanisms.criu.provision import find_criu

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))
    out: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "kernel": platform.release(),
                           "criu": find_criu().version_str, "python": platform.python_version()}
    if with_torch:
        import torch

        out |= {"torch": torch.__version__, "load_average_at_start": os.getloadavg()}
    return out


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.01) -> T:
    """Poll ``check`` until it returns something true, and return that; raise after ``timeout`` seconds."""
    return wait_until(check, timeout=timeout, what=what, interval=interval,
                      hint="is the machine very busy? run the benchmark again when it is quieter")


def base_env() -> dict[str, str]:
    """The environment of a benchmark's ranks and reference runs: this one without Tidal's settings or a
    PYTHONPATH, one thread each for the math libraries, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env.pop("PYTHONPATH", None)
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def workspace(path: Path) -> Iterator[Path]:
    """A fresh, empty ``path`` for the run, removed afterwards."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_json(path: Path | str | None, out: dict[str, Any]) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
