"""Which failed plain ``torchrun`` runs still serve as a reference: only those whose ranks all printed their
last line and whose every reported failure is torch's abort at exit."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidal.testing.torchrun import EXIT_ABORT, ReferenceFailed, TorchRun

ABORTED = """Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 4242)
  traceback : Signal 6 (SIGABRT) received by PID 4242
"""
FAILED = ABORTED.replace("exitcode  : -6", "exitcode  : 1")
# torchrun stops the other ranks with SIGTERM once one failed, and reports them too.
STOPPED = """Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4241)  (SIGTERM)
""" + ABORTED.replace("rank      : 0 (local_rank: 0)", "rank      : 1 (local_rank: 1)")


def fake(rc: int, report: str, ranks: dict[int, tuple[str, str]]) -> Callable[..., subprocess.Popen[bytes]]:
    """Starts, instead of torchrun, a shell that writes each rank's logs as torchrun would and exits ``rc``
    after printing ``report`` (torchrun's failure summary) on its stderr."""

    def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        logs = Path(argv[argv.index("--log-dir") + 1])
        for r, (out, err) in ranks.items():
            d = logs / "run_0" / "attempt_0" / str(r)
            d.mkdir(parents=True)
            (d / "stdout.log").write_text(out)
            (d / "stderr.log").write_text(err)
        return subprocess.Popen(["sh", "-c", 'printf %s "$0" >&2; exit "$1"', report, str(rc)], **kwargs)
    return popen


def run(tmp_path: Path, rc: int, report: str, ranks: dict[int, tuple[str, str]]) -> TorchRun:
    return TorchRun(["x.py"], nproc=len(ranks), cwd=tmp_path, popen=fake(rc, report, ranks)).wait(30)


def test_a_run_that_succeeded_is_the_reference(tmp_path: Path) -> None:
    ref = run(tmp_path, 0, "", {0: ("rank 0 step 1\nrank 0 done\n", ""), 1: ("rank 1 step 1\n", "")})
    assert ref.stdout(1) == "rank 1 step 1\n"


def test_ranks_aborted_at_exit_after_their_last_line_are_forgiven(tmp_path: Path) -> None:
    ref = run(tmp_path, 1, ABORTED, {0: ("rank 0 step 1\nrank 0 done, world 2\n", "warning\n" + EXIT_ABORT),
                                     1: ("rank 1 step 1\nrank 1 done, world 2\n", "")})
    assert ref.stdout(0).endswith("rank 0 done, world 2\n")


def test_ranks_torchrun_stopped_after_the_abort_are_forgiven_once_done(tmp_path: Path) -> None:
    ref = run(tmp_path, 1, STOPPED, {0: ("rank 0 done, world 2\n", ""), 1: ("rank 1 done, world 2\n", EXIT_ABORT)})
    assert ref.stdout(1) == "rank 1 done, world 2\n"
    with pytest.raises(ReferenceFailed, match="exited 1"):
        run(tmp_path / "cut", 1, STOPPED, {0: ("rank 0 step 9\n", ""), 1: ("rank 1 done\n", EXIT_ABORT)})


def test_a_stop_without_an_abort_is_not_forgiven(tmp_path: Path) -> None:
    with pytest.raises(ReferenceFailed, match="exited 1"):
        run(tmp_path, 1, STOPPED.replace("-6 (pid", "-15 (pid"),
            {0: ("rank 0 done\n", ""), 1: ("rank 1 done\n", EXIT_ABORT)})


def test_an_abort_before_a_rank_s_last_line_fails_with_torchrun_s_report(tmp_path: Path) -> None:
    with pytest.raises(ReferenceFailed, match=r"(?s)the torchrun reference exited 1:.*exitcode  : -6"):
        run(tmp_path, 1, ABORTED, {0: ("rank 0 done\n", EXIT_ABORT), 1: ("rank 1 step 1\n", "")})


def test_any_other_failure_fails_with_the_ranks_stderr(tmp_path: Path) -> None:
    with pytest.raises(ReferenceFailed, match=r"(?s)exited 1:.*--- rank 1 stderr:\nTraceback"):
        run(tmp_path, 1, FAILED, {0: ("rank 0 done\n", EXIT_ABORT), 1: ("rank 1 done\n", "Traceback\n")})


def test_an_abort_not_seen_in_any_rank_s_stderr_is_not_forgiven(tmp_path: Path) -> None:
    with pytest.raises(ReferenceFailed, match="exited 1"):
        run(tmp_path, 1, ABORTED, {0: ("rank 0 done\n", ""), 1: ("rank 1 done\n", "")})


def test_a_rank_without_logs_fails_with_torchrun_s_report(tmp_path: Path) -> None:
    ref = TorchRun(["x.py"], nproc=2, cwd=tmp_path, popen=fake(1, ABORTED, {0: ("rank 0 done\n", EXIT_ABORT)}))
    with pytest.raises(ReferenceFailed, match=r"(?s)exited 1:.*exitcode  : -6"):
        ref.wait(30)
