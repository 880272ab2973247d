"""A cgroup2-only view of this machine, for tests of Tidal on hosts that mount cgroup v2 only.

:func:`run_in_v2_view` runs a function of a test module in a child process in a mount namespace of its own
(``unshare --mount --propagation private``), in which every cgroup mount under ``/sys/fs/cgroup`` is
unmounted and a fresh cgroup2 mount takes its place. Tidal there detects v2, as on a unified host. The
machine's own mounts, which other test runs use, are not touched: the unmounts happen in the child's
namespace only, and end with it.

The cgroup2 mount is the machine's unified hierarchy (one per kernel). Where the machine also mounts cgroup
v1 controllers (hybrid), those controllers cannot be enabled in cgroup2: the view has the core features
(``cgroup.freeze``, ``cgroup.kill``, ``cgroup.events``, ``cgroup.procs``) and no ``cpu`` or ``cpuset``.
A function calls :func:`skip` for what needs those, and the test is skipped with that reason.

The function runs as ``python -m tests.integration.cgroup2_view MODULE:FUNCTION ARG...`` (string arguments,
e.g. the test's ``tmp_path``); an exception fails the test with the child's output. The child is a child
subreaper (restored ranks are re-parented to it) and checks that the view is what it claims to be.

Whole test files run in the view too (``make test-cgroup2``)::

    unshare --mount --propagation private .venv/bin/python -m tests.integration.cgroup2_view --pytest FILE...
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CGROUP = Path("/sys/fs/cgroup")
SKIPPED = 77  # the child's exit code for "skip", with a line "SKIP: reason"


def run_in_v2_view(fn: Callable[..., object], *args: object, timeout: float = 240) -> str:
    """Run ``fn(*map(str, args))`` in the cgroup2-only view; its output (stdout and stderr)."""
    target = f"{fn.__module__}:{fn.__name__}"
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", __name__, target,
            *map(str, args)]
    proc = subprocess.run(argv, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode == SKIPPED:
        reasons = [line[len("SKIP: "):] for line in out.splitlines() if line.startswith("SKIP: ")]
        pytest.skip(f"cgroup2 view: {reasons[-1] if reasons else 'skipped'}")
    assert proc.returncode == 0, f"{target} failed in the cgroup2 view (exit {proc.returncode}):\n{out[-8000:]}"
    return out


def skip(reason: str) -> None:
    """From inside the view: skip the calling test, saying why."""
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIPPED)


def _cgroup_mounts() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(CGROUP) or fields[4].startswith(f"{CGROUP}/"):
            points.append(fields[4])
    return points


def enter_view() -> None:
    """Make this (private) mount namespace's /sys/fs/cgroup a lone cgroup2 mount."""
    if _cgroup_mounts():
        subprocess.run(["umount", "--recursive", str(CGROUP)], check=True)
    subprocess.run(["mount", "-t", "cgroup2", "cgroup2", str(CGROUP)], check=True)
    from tidal.mechanisms.criu import cgroups

    layout = cgroups.detect()
    assert layout.mode == "v2" and layout.v2 == CGROUP and not layout.v1_controllers, layout


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pytest"]:  # whole test files in the view: python -m tests.integration.cgroup2_view --pytest ...
        enter_view()
        return int(pytest.main(argv[1:]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    target, *args = argv
    module, name = target.split(":")
    # Before anything of Tidal looks at the mounts (the hierarchy is detected once per process).
    enter_view()
    from tidal.mechanisms.criu.rank import become_subreaper

    become_subreaper()
    fn = getattr(importlib.import_module(module), name)
    try:
        fn(*args)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
