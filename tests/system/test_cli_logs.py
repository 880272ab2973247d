"""`tidal logs -f` on a real cluster: it follows a job's output across a preemption, a resume and a migration
(checkpoints and restores under CRIU) to its end, the output exactly the uninterrupted run's, and exits with the
job's exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.system.cluster import JOB, reference_run


def test_logs_follow_a_job_across_preemption_and_migration(make_cluster, workdir: Path, gate: Path,
                                                           tmp_path: Path) -> None:
    expected, _ = reference_run(tmp_path)
    c = make_cluster(nodes=2, devices=1)
    job = c.cli("submit", "-q", "--env", f"GATE={gate}", "--", "sh", "-c", JOB, cwd=workdir).stdout.strip()
    follower = subprocess.Popen([sys.executable, "-m", "tidal.cli.main", "logs", "-f", job],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=c.env)
    try:
        first = c.wait_state(job, "running")["placement"][0]["node"]
        c.cli("preempt", job, timeout=300)
        c.cli("resume", job, timeout=300)
        c.cli("migrate", job, timeout=300)
        assert c.wait_state(job, "running")["placement"][0]["node"] != first
        assert follower.poll() is None  # still following
        gate.touch()
        out, err = follower.communicate(timeout=300)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert out == expected


def test_logs_follow_exits_with_the_jobs_exit_code(make_cluster, workdir: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    job = c.cli("submit", "-q", "--", "sh", "-c", "echo about to fail; sleep 1; exit 7", cwd=workdir).stdout.strip()
    p = c.cli("logs", "-f", job, check=False, timeout=120)
    assert (p.returncode, p.stdout) == (7, "about to fail\n")
    assert p.stderr == f"job {job} failed: rank 0 exited with code 7 (root cause)\n"
