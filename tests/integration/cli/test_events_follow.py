"""`tidal events -f`: the event log followed over the control plane's event stream. With `--job J` it prints the
job's events as they come and exits once the job ends, with its exit status (as `tidal wait`); without, it runs
until interrupted."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading

from tests.integration.cli.conftest import Served
from tidal.testing.control import FakeAgent, checkpoint_result


class Follower:
    """`tidal events -f ARGS` running, its stdout lines in a queue."""

    def __init__(self, s: Served, *args: str) -> None:
        # SIGINT as a terminal's Ctrl-C finds it: a test run started in the background (a shell's `&`, as a CI
        # runner may) has it ignored, which its children would inherit.
        self.proc = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "events", "-f", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=s.env,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def until(self, kind: str, timeout: float = 20.0) -> list[dict[str, object]]:
        """Events printed (-o json: one per line) up to the first of ``kind``."""
        out = []
        while True:
            e = json.loads(self.lines.get(timeout=timeout))
            out.append(e)
            if e["kind"] == kind:
                return out


def test_follow_a_job_until_it_ends_with_its_exit_status(served_plane: Served) -> None:
    p = served_plane.plane
    a = FakeAgent(p, "node-1", "A")
    a.register()
    jid = p.submit(name="train")
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 10}])
    f = Follower(served_plane, "--job", jid, "-o", "json")
    try:
        printed = f.until("started")  # what was logged before it started
        assert printed[0]["kind"] == "submitted" and {e["job"] for e in printed} == {jid}
        r = p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user())
        assert r.status_code == 200
        (act,) = a.actions()
        assert a.result(act, **checkpoint_result(act["payload"]["checkpoint_id"]))
        printed += f.until("preempted")
        assert [e["kind"] for e in printed[-2:]] == ["checkpointing", "preempted"]
        p.http.post(f"/v1/jobs/{jid}/resume", headers=p.as_user())
        p.rec.once()
        (act,) = a.actions()
        assert a.result(act, ranks=[{"rank": 0, "pid": 11}])
        assert a.exit(jid, p.job(jid)["attempt"], code=3)
        printed += f.until("failed")
        assert f.proc.wait(timeout=20) == 3  # the failing rank's exit code, as `tidal wait`
        seqs = [int(str(e["seq"])) for e in printed]
        assert seqs == sorted(set(seqs))  # in order, none twice
        logged = p.http.get("/v1/events", headers=p.as_user(), params={"job": jid}).json()
        assert printed == logged  # every event of the job, as the log has it
    finally:
        f.proc.kill()
        f.proc.wait()


def test_follow_an_ended_job_exits_at_once_and_the_log_until_interrupted(served_plane: Served) -> None:
    p = served_plane.plane
    jid = p.submit(name="train")
    p.http.post(f"/v1/jobs/{jid}/cancel", headers=p.as_user())
    done = served_plane.cli("events", "-f", "--job", jid, check=False, timeout=30)
    assert done.returncode == 130, done.stderr  # cancelled, as `tidal wait` says
    assert "cancelled" in done.stdout
    f = Follower(served_plane)
    try:
        f.lines.get(timeout=20)  # the log so far: its lines, in table form
        other = p.submit(name="later")
        line = f.lines.get(timeout=20)
        while other not in line:
            line = f.lines.get(timeout=20)
        assert "submitted" in line
        f.proc.send_signal(signal.SIGINT)
        assert f.proc.wait(timeout=20) == 130
    finally:
        f.proc.kill()
        f.proc.wait()
