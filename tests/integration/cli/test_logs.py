"""`tidal logs`: every rank merged with a `[rank N] ` prefix, one rank (or a job of one rank) exactly as written;
`-f` follows across a preemption and exits with the job's exit status. The ranks' output is written where
the control plane keeps it, as an agent's log reports would."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.integration.cli.conftest import Served
from tidal.control.agents import log_path
from tidal.testing.control import FakeAgent, checkpoint_result
from tidal.waiting import wait_until


def running(s: Served, ranks: int = 1) -> tuple[FakeAgent, str]:
    p = s.plane
    a = FakeAgent(p, "node-1", "A", devices=2)
    a.register()
    jid = p.submit(name="train", ranks=ranks)
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": r, "pid": 10 + r} for r in range(ranks)])
    return a, jid


def write(s: Served, jid: str, rank: int, data: bytes) -> None:
    path = log_path(s.plane.workdir, jid, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(data)


def exits(a: FakeAgent, jid: str, codes: list[int]) -> None:
    """Every rank of the job's current attempt ended with these codes."""
    attempt = a.p.job(jid)["attempt"]
    r = a.p.http.post(f"/v1/agent/{a.name}/exits", headers=a.p.as_agent(), json={
        "agent_id": a.id, "job_id": jid, "attempt": attempt,
        "ranks": [{"rank": r, "code": c, "signal": None} for r, c in enumerate(codes)]})
    assert r.json()["applied"], r.text


def test_ranks_merged_with_a_prefix_or_one_exactly(served_plane: Served) -> None:
    _, jid = running(served_plane, ranks=2)
    write(served_plane, jid, 0, b"step 1\nstep 2\n")
    write(served_plane, jid, 1, b"warming up\nno newline at the end")
    assert served_plane.cli("logs", jid).stdout == (
        "[rank 0] step 1\n[rank 0] step 2\n[rank 1] warming up\n[rank 1] no newline at the end\n")
    assert served_plane.cli("logs", jid, "--rank", "1").stdout == "warming up\nno newline at the end"
    p = served_plane.cli("logs", jid, "--rank", "2", check=False)
    assert p.returncode == 1
    assert p.stderr == (f"error: --rank: job {jid} has ranks 0..1, not 2\n"
                        f"hint: `tidal show {jid}` lists its ranks\n")


def test_a_job_of_one_rank_has_no_prefix(served_plane: Served) -> None:
    _, jid = running(served_plane)
    write(served_plane, jid, 0, b"exactly\nas written")
    assert served_plane.cli("logs", jid).stdout == "exactly\nas written"


def follow(s: Served, jid: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "logs", "-f", jid], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=s.env)


def test_follow_across_a_preemption_until_success(served_plane: Served) -> None:
    p = served_plane.plane
    a, jid = running(served_plane, ranks=2)
    write(served_plane, jid, 0, b"before\n")
    f = follow(served_plane, jid)
    try:
        time.sleep(1.5)  # it follows the running job
        assert p.http.post(f"/v1/jobs/{jid}/preempt", headers=p.as_user()).status_code == 200
        (act,) = a.actions()
        assert a.result(act, **checkpoint_result(act["payload"]["checkpoint_id"]))
        wait_until(lambda: p.job(jid)["state"] == "preempted", timeout=10, what="the job to be preempted")
        time.sleep(0.5)
        assert f.poll() is None  # a preempted job is not over: the follower waits
        assert p.http.post(f"/v1/jobs/{jid}/resume", headers=p.as_user()).status_code == 200
        p.rec.once()
        (act,) = a.actions()
        assert act["kind"] == "restore"
        assert a.result(act, ranks=[{"rank": 0, "pid": 20}, {"rank": 1, "pid": 21}])
        write(served_plane, jid, 1, b"after the restore\n")
        write(served_plane, jid, 0, b"done\n")
        exits(a, jid, [0, 0])
        out, err = f.communicate(timeout=30)
    finally:
        f.kill()
    assert f.returncode == 0, err
    assert sorted(out.splitlines()) == ["[rank 0] before", "[rank 0] done", "[rank 1] after the restore"]
    assert out.index("[rank 0] before") < out.index("[rank 1] after the restore")


def test_follow_exits_with_the_jobs_exit_status(served_plane: Served) -> None:
    p = served_plane.plane
    a, jid = running(served_plane)
    f = follow(served_plane, jid)
    try:
        time.sleep(1.0)
        write(served_plane, jid, 0, b"Traceback: boom\n")
        assert a.exit(jid, p.job(jid)["attempt"], code=3)
        out, err = f.communicate(timeout=30)
    finally:
        f.kill()
    assert (f.returncode, out) == (3, "Traceback: boom\n")
    assert err == f"job {jid} failed: rank 0 exited with code 3 (root cause)\n"
    # After the end, -f prints what there is and exits with the same status; `tidal wait` agrees.
    assert served_plane.cli("logs", "-f", jid, check=False).returncode == 3
    assert served_plane.cli("wait", jid, check=False).returncode == 3

    _, other = running(served_plane)
    assert p.http.post(f"/v1/jobs/{other}/cancel", headers=p.as_user()).status_code == 200
    cancelled = served_plane.cli("logs", "-f", other, check=False)
    assert (cancelled.returncode, cancelled.stderr) == (130, f"job {other} was cancelled\n")


def test_logs_of_a_path_that_is_no_job(served_plane: Served, tmp_path: Path) -> None:
    p = served_plane.cli("logs", "nope", check=False)
    assert p.returncode == 1 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr
