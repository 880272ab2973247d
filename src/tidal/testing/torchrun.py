"""Plain ``torchrun`` runs: the reference that Tidal's results are compared with.

Each rank writes its own ``stdout.log`` and ``stderr.log`` (``--redirects 3``), as the comparisons need them
per rank. One thing of plain torch is forgiven, and only that: torch 2.13 sometimes aborts a rank at
interpreter exit, after ``destroy_process_group`` (gloo still has a joinable thread then; seen in about one
suite run in three, never in a Tidal process). Such a run is complete, and :meth:`TorchRun.wait` accepts it
when every rank printed its last line and the failures torchrun reports are that abort and the SIGTERM it then
sends the other ranks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from tidal.errors import TidalError

# What the C++ runtime prints as it aborts such a rank.
EXIT_ABORT = "terminate called without an active exception\n"
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
# After the first rank fails torchrun stops the others with SIGTERM, and reports them as failed too.
_FORGIVEN = {-signal.SIGABRT, -signal.SIGTERM}


class ReferenceFailed(TidalError):
    """The plain ``torchrun`` run that a test compares Tidal with failed: the comparison cannot be made."""


Done = Callable[[int, str], bool]


def last_line_done(rank: int, stdout: str) -> bool:
    """Whether a rank's output ends with the line our example scripts print last (``rank R done…``)."""
    lines = stdout.splitlines()
    return bool(lines) and lines[-1].startswith(f"rank {rank} done")


class TorchRun:
    """One plain ``torchrun`` (or one node's agent of a run over several), started in the background, in its
    own session so that :meth:`kill` reaches its workers too (they outlive a killed ``torchrun``).

    ``argv``: the script and its arguments; ``options``: more of torchrun's own (``--nnodes`` …);
    ``popen``: how to start it, in a session of its own (a test host's ``popen`` starts it in that host's
    network namespace);
    ``first_rank``: the global rank of this agent's local rank 0."""

    def __init__(self, argv: Sequence[str], *, nproc: int, cwd: Path, logs: Path | None = None,
                 env: Mapping[str, str] | None = None, options: Sequence[str] = (), first_rank: int = 0,
                 popen: Callable[..., subprocess.Popen[Any]] = partial(subprocess.Popen,
                                                                         start_new_session=True)) -> None:
        self.nproc, self.cwd, self.first_rank = nproc, cwd, first_rank
        self.logs = logs or cwd / "torchrun-logs"
        self.errors = self.logs.with_name(self.logs.name + ".err")  # torchrun's own stderr
        self.logs.parent.mkdir(parents=True, exist_ok=True)
        with open(self.errors, "wb") as err:
            self.proc = popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                               *options, "--log-dir", str(self.logs), "--redirects", "3", *argv],
                              cwd=cwd, env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=err)

    def _rank_dir(self, local: int) -> Path:
        (found,) = self.logs.glob(f"*/attempt_0/{local}")
        return found

    def stdout(self, local: int) -> str:
        return (self._rank_dir(local) / "stdout.log").read_text()

    def stderr(self, local: int) -> str:
        return (self._rank_dir(local) / "stderr.log").read_text()

    def wait(self, timeout: float = 600, *, done: Done = last_line_done) -> TorchRun:
        """Wait for the end; :class:`ReferenceFailed` with torchrun's report and the ranks' stderr unless it
        succeeded, or failed only by the abort at exit above after every rank was ``done`` (given the global
        rank and its output)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ReferenceFailed(f"the torchrun reference did not end within {timeout:.0f}s:\n"
                                  f"{self._tail()}") from None
        if self.proc.returncode != 0 and not self.aborted_after_done(done):
            raise ReferenceFailed(f"the torchrun reference exited {self.proc.returncode}:\n{self._tail()}")
        return self

    def aborted_after_done(self, done: Done = last_line_done) -> bool:
        """Whether the run failed only by ranks that aborted at exit after their last line (and the others
        torchrun then stopped)."""
        codes = {int(c) for c in _EXITCODE.findall(self.errors.read_text(errors="replace"))}
        if -signal.SIGABRT not in codes or not codes <= _FORGIVEN:
            return False
        try:
            if not any(self.stderr(r).endswith(EXIT_ABORT) for r in range(self.nproc)):
                return False
            return all(done(self.first_rank + r, self.stdout(r)) for r in range(self.nproc))
        except (ValueError, OSError):  # a rank's logs are missing: it never ran to the end
            return False

    def _tail(self) -> str:
        text = self.errors.read_text(errors="replace")[-2500:]
        for r in range(self.nproc):
            with contextlib.suppress(ValueError, OSError):
                text += f"\n--- rank {self.first_rank + r} stderr:\n{self.stderr(r)[-800:]}"
        return text

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def torchrun(argv: Sequence[str], *, nproc: int, cwd: Path, env: Mapping[str, str] | None = None,
             options: Sequence[str] = (), timeout: float = 600, done: Done = last_line_done) -> TorchRun:
    """A plain ``torchrun`` run on this machine, to its end (see :class:`TorchRun`)."""
    return TorchRun(argv, nproc=nproc, cwd=cwd, env=env, options=options).wait(timeout, done=done)
