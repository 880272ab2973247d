"""Secrets at rest: the database, its WAL and shared-memory files, the token files and the logs are the
owner's only whatever the umask; a submitted job's stored environment holds none of the submitter's
credentials nor variables the job was not given; the database holds tokens only as sha256."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import text

from tidal.config import Settings
from tidal.control import localcluster
from tidal.control.clusterfile import Proc
from tidal.control.store.db import Database, migrate
from tidal.control.store.models import ActionRow, JobRow
from tidal.testing.control import FakeAgent, Plane, start
from tidal.testing.server import served


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # what a user's shell usually has
    yield
    os.umask(old)


def test_state_files_are_owner_only(tmp_path: Path, umask_022: None) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home)
    localcluster.bootstrap(settings)
    assert mode(home / "tidal.db") == 0o600
    assert mode(home / "tokens") == 0o700 and mode(home / "logs") == 0o700
    assert sorted(p.name for p in (home / "tokens").iterdir()) == ["admin.token", "cluster.token", "user.token"]
    for f in (home / "tokens").iterdir():
        assert mode(f) == 0o600, f
    db = Database(settings.db_url)
    with db.tx() as s:
        s.execute(text("CREATE TABLE probe (x INTEGER)"))
    assert mode(home / "tidal.db-wal") == 0o600 and mode(home / "tidal.db-shm") == 0o600
    db.close()

    # the control plane's and the agents' logs
    proc = localcluster._respawn(Proc(0, [sys.executable, "-c", "print('hello')"], str(home / "logs" / "x.log")),
                                 settings)
    os.waitpid(proc.pid, 0)
    assert mode(home / "logs" / "x.log") == 0o600 and (home / "logs" / "x.log").read_text() == "hello\n"


def test_files_an_older_version_left_readable_are_tightened(tmp_path: Path, umask_022: None) -> None:
    home = tmp_path / "home"
    settings = Settings(home=home)
    localcluster.bootstrap(settings)
    for p in (home / "tidal.db", home / "logs" / "control.log"):
        p.touch()
        p.chmod(0o644)
    (home / "tokens").chmod(0o755)
    (home / "logs").chmod(0o755)
    localcluster.bootstrap(settings)
    Database(settings.db_url).close()
    localcluster._respawn(Proc(0, ["true"], str(home / "logs" / "control.log")), settings)
    assert mode(home / "tidal.db") == 0o600 and mode(home / "logs" / "control.log") == 0o600
    assert mode(home / "tokens") == 0o700 and mode(home / "logs") == 0o700


def test_served_job_logs_are_owner_only(tmp_path: Path, umask_022: None) -> None:
    plane = Plane(tmp_path)
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)
    r = plane.http.put(f"/v1/agent/node-1/logs/{jid}/0", headers=plane.as_agent(), content=b"secret\n",
                       params={"agent_id": "A", "attempt": 1, "offset": 0})
    assert r.json()["applied"] is True
    logs = tmp_path / "logs"
    assert [mode(p) for p in (logs, logs / "jobs", logs / "jobs" / jid)] == [0o700] * 3
    assert mode(logs / "jobs" / jid / "0.log") == 0o600
    plane.db.close()


def test_a_submitted_job_holds_no_credentials(tmp_path: Path) -> None:
    plane = Plane(tmp_path)
    caller = {
        "PATH": os.environ["PATH"], "HOME": "/home/alice", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "3",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "TIDAL_TOKEN": plane.user, "TIDAL_HOME": str(tmp_path / "nowhere"),
        "AWS_SECRET_ACCESS_KEY": "aws-secret", "CUDA_VISIBLE_DEVICES": "0", "GATE": "/tmp/gate",
    }
    with served(plane.http.app) as url:
        p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "submit", "-q", "--env", "GATE",
                            "--env", "EXTRA=1", "--", "python", "train.py"], capture_output=True, text=True,
                           cwd=tmp_path, env={**caller, "TIDAL_URL": url}, timeout=60)
        assert p.returncode == 0, p.stderr
        jid = p.stdout.strip()
        # the scheduler hands it out: the launch action carries the environment too
        a = FakeAgent(plane, "node-1", "A")
        a.register()
        start(plane, a, jid)
    with plane.db.read() as s:
        job = s.get(JobRow, jid)
        assert job is not None
        assert job.spec["env"] == {"PATH": caller["PATH"], "HOME": "/home/alice", "LC_ALL": "C.UTF-8",
                                   "OMP_NUM_THREADS": "3", "PYTHONPATH": caller["PYTHONPATH"],
                                   "GATE": "/tmp/gate", "EXTRA": "1"}
        (launch,) = s.query(ActionRow).filter(ActionRow.job_id == jid).all()
        assert launch.payload["env"] == job.spec["env"]
    plane.db.close()
    _assert_no_plaintext(tmp_path / "tidal.db", tokens=[plane.user, plane.agent], others=["aws-secret"])


def _assert_no_plaintext(db_file: Path, tokens: list[str], others: list[str]) -> None:
    """Nowhere in the database, its rows or its files, is a secret in plain text; tokens are sha256."""
    secrets = tokens + others
    db = Database(f"sqlite:///{db_file}")
    with db.read() as s:
        hashes = {h for (h,) in s.execute(text("SELECT token_hash FROM user_tokens"))}
        tables = [t for (t,) in s.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'"))]
        dump = "\n".join(repr(row) for t in tables for row in s.execute(text(f'SELECT * FROM "{t}"')))
    db.close()
    for secret in secrets:
        assert secret not in dump
    assert {hashlib.sha256(t.encode()).hexdigest() for t in tokens} <= hashes
    for f in db_file.parent.glob(db_file.name + "*"):
        raw = f.read_bytes()
        for secret in secrets:
            assert secret.encode() not in raw, f


def test_migration_removes_credentials_from_existing_jobs(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config

    from tidal.control.store.db import MIGRATIONS

    token = "tdl_" + "s3cret" * 6
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")  # the revision before 0005, whose rows the models still write
    # BIG: the environment spans pages, so rewriting it frees space the token was in
    kept = {"PATH": "/bin", "MY_TIDAL_THING": "kept", "BIG": "b" * 9000}
    env = {**kept, "TIDAL_TOKEN": token, "tidal_home": "/x"}
    # Rows as revision 0004 holds them (the models of today have columns it lacks).
    jobs = sa.table("jobs", *(sa.column(c) for c in ("id", "seq", "name", "owner", "tier", "ranks", "state", "held",
                                                     "submitted_at", "restarts", "attempt")),
                    sa.column("placement", sa.JSON), sa.column("spec", sa.JSON))
    actions = sa.table("actions", *(sa.column(c) for c in ("id", "job_id", "node", "kind", "status", "created_at")),
                       sa.column("payload", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(jobs.insert(), [
            dict(id="j1", seq=1, name="j", owner="alice", tier="basic", ranks=1, state="running", held=False,
                 submitted_at=0.0, restarts=0, attempt=1, placement=[],
                 spec={"command": ["x"], "workdir": "/", "env": env}),
            dict(id="j2", seq=2, name="k", owner="alice", tier="basic", ranks=1, state="pending", held=False,
                 submitted_at=0.0, restarts=0, attempt=0, placement=[],
                 spec={"command": ["x"], "workdir": "/", "env": {"A": "1"}})])
        conn.execute(actions.insert(), [dict(id="a-1", job_id="j1", node="n", kind="launch", status="done",
                                             created_at=0.0, payload={"job_id": "j1", "env": env})])
    db.close()
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    migrate(db.engine)
    with db.read() as s:
        j1, j2, act = s.get(JobRow, "j1"), s.get(JobRow, "j2"), s.get(ActionRow, "a-1")
        assert j1 is not None and j2 is not None and act is not None
        assert j1.spec == {"command": ["x"], "workdir": "/", "env": kept}
        assert j2.spec["env"] == {"A": "1"}
        assert act.payload == {"job_id": "j1", "env": kept}
    db.close()
    for f in tmp_path.glob("old.db*"):
        assert token.encode() not in f.read_bytes(), f
