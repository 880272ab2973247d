"""Migration 0014 (jobs' attained service and last cluster) on SQLite and PostgreSQL: a job from before it starts
from no service and no cluster, both are stored, and it downgrades."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.control.store.revisions import columns, to
from tidal.control.store.db import Database
from tidal.control.store.models import JobRow


def upgrade_from_0013(url: str) -> None:
    db = Database(url)
    to(db, "0013")
    jobs = sa.table("jobs", *(sa.column(c) for c in ("id", "seq", "name", "owner", "tier", "ranks", "state", "held",
                                                     "submitted_at", "restarts", "attempt")),
                    sa.column("placement", sa.JSON), sa.column("spec", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(jobs).values(id="j1", seq=1, name="t", owner="u", tier="basic", ranks=1,
                                            state="preempted", held=False, submitted_at=1.0, restarts=0, attempt=1,
                                            placement=[], spec={"command": ["t"], "workdir": "/w"}))
    new = {"attained_device_s", "last_cluster"}
    assert not new & columns(db, "jobs")
    db.migrate()
    with db.tx() as s:
        job = s.get(JobRow, "j1")
        # Its runs before the upgrade are not known.
        assert job is not None and (job.attained_device_s, job.last_cluster) == (0.0, None)
        job.attained_device_s, job.last_cluster = 120.5, "west-a"
    with db.read() as s:
        job = s.get(JobRow, "j1")
        assert job is not None and (job.attained_device_s, job.last_cluster) == (120.5, "west-a")
    to(db, "0013", up=False)
    assert not new & columns(db, "jobs")
    db.migrate()
    assert new <= columns(db, "jobs")
    db.close()


def test_migration_0014_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0013(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0014_on_postgres(postgres_url: str) -> None:
    upgrade_from_0013(postgres_url)
