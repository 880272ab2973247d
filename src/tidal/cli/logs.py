"""``tidal logs JOB``: a job's output, every rank's merged or one rank's, followed (``-f``) until the job ends.

Each rank's output is one log at the control plane, across all its attempts (a restore goes on where the
checkpoint left it), so following it needs nothing special across preemptions, migrations and restores: the
log grows again when the job runs again. A follower ends when the job has ended and every log is read, and
exits with the job's exit status (:func:`exit_status`), as ``tidal wait`` does.
"""

from __future__ import annotations

import sys
import time
from typing import Any, BinaryIO

import typer

from tidal.cli.api import Api, Client
from tidal.cli.output import err_console
from tidal.cli.terms import phrased

TERMINAL = {"succeeded", "failed", "cancelled"}
CANCELLED = 130  # as a shell reports a program stopped by Ctrl-C


def exit_status(job: dict[str, Any]) -> int:
    """What ``tidal wait`` and ``tidal logs -f`` exit with once the job has ended: 0 when it succeeded; when it
    failed, the exit code of the rank that failed first (1 when that is 0 or over 255, or when the job has none:
    it was lost, e.g. killed by a signal from outside Tidal, after its last restart); 130 when it was cancelled."""
    if job["state"] == "succeeded":
        return 0
    if job["state"] == "cancelled":
        return CANCELLED
    code = job.get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else 1


def outcome(job: dict[str, Any]) -> str:
    """A line for stderr on how the job ended, when it did not succeed."""
    if job["state"] == "cancelled":
        return f"job {job['id']} was cancelled"
    return f"job {job['id']} {job['state']}: {job.get('error') or 'no error recorded'}"


class RankLog:
    """One rank's log, read from where the last read ended. With a ``prefix``, whole lines only (a line not yet
    ended waits for its end, or for the last read)."""

    def __init__(self, rank: int, prefix: bool) -> None:
        self.rank = rank
        self.prefix = f"[rank {rank}] ".encode() if prefix else b""
        self.offset = 0
        self.partial = b""

    def read(self, api: Client, job_id: str, out: BinaryIO) -> tuple[bool, str]:
        """Write what the log holds beyond what was read; whether there was any, and the job's state then."""
        got = False
        while True:
            r = api.request("GET", f"/v1/jobs/{job_id}/logs", params={"rank": self.rank, "offset": self.offset})
            size = int(r.headers["X-Tidal-Log-Size"])
            state = r.headers["X-Tidal-Job-State"]
            if r.content:
                got = True
                out.write(self.lines(r.content))
                out.flush()
            # A reply holds at most a few MiB of the log: ask again from where it ended.
            self.offset = self.offset + len(r.content) if r.content else min(self.offset, size)
            if self.offset >= size:
                return got, state

    def lines(self, data: bytes) -> bytes:
        if not self.prefix:
            return data
        data = self.partial + data
        end = data.rfind(b"\n") + 1
        self.partial = data[end:]
        return b"".join(self.prefix + line for line in data[:end].splitlines(keepends=True))

    def rest(self) -> bytes:
        """The last line, when the output did not end with a newline: it gets one."""
        rest, self.partial = self.partial, b""
        return self.prefix + rest + b"\n" if rest else b""


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(job_id: str = typer.Argument(..., metavar="JOB", help="the job's id (`tidal ls`)"),
             follow: bool = typer.Option(False, "-f", "--follow",
                                         help="follow the output as it is written, across preemptions, migrations "
                                              "and restores, until the job ends; then exit with its exit status "
                                              "(0: succeeded; failed: the failing rank's exit code, 1 without one; "
                                              "130: cancelled)"),
             rank: int = typer.Option(None, "--rank", min=0,
                                      help="only this rank's output, exactly as it wrote it (no prefix)")) -> None:
        """Print a job's output: every rank's, each line prefixed with `[rank N] ` (rank 0's lines first, then
        rank 1's, …; with -f, as they come); a job of one rank, or --rank N: the output exactly as the program
        wrote it, across all its restores."""
        with phrased({"rank": "--rank"}, hint=f"`tidal show {job_id}` lists its ranks"):
            _logs(Api(), job_id, follow, rank)


def _logs(api: Client, job_id: str, follow: bool, rank: int | None) -> None:
    job = api.get(f"/v1/jobs/{job_id}")
    ranks = [rank] if rank is not None else list(range(job["ranks"]))
    merged = rank is None and job["ranks"] > 1
    streams = [RankLog(r, merged) for r in ranks]
    out = sys.stdout.buffer
    while True:
        # Done once a round that began with the job ended read nothing more: its logs were complete.
        got, first = False, ""
        for s in streams:
            more, state = s.read(api, job_id, out)
            got, first = got or more, first or state
        if not follow or (first in TERMINAL and not got):
            break
        time.sleep(0.2)
    for s in streams:
        out.write(s.rest())
    out.flush()
    if follow:
        job = api.get(f"/v1/jobs/{job_id}")
        code = exit_status(job)
        if code:
            err_console.print(outcome(job), style="yellow" if code == CANCELLED else "red", highlight=False,
                              markup=False)
        raise typer.Exit(code)
