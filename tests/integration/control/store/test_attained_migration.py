"""Migration 0014 (jobs' attained service) on SQLite and PostgreSQL: a job from before it starts from none, its
service is stored, and it downgrades."""

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
    assert "attained_device_s" not in columns(db, "jobs")
    db.migrate()
    with db.tx() as s:
        job = s.get(JobRow, "j1")
        assert job is not None and job.attained_device_s == 0.0  # its runs before the upgrade are not known
        job.attained_device_s = 120.5
    with db.read() as s:
        assert s.get(JobRow, "j1").attained_device_s == 120.5  # type: ignore[union-attr]
    to(db, "0013", up=False)
    assert "attained_device_s" not in columns(db, "jobs")
    db.migrate()
    assert "attained_device_s" in columns(db, "jobs")
    db.close()


def test_migration_0014_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0013(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0014_on_postgres(postgres_url: str) -> None:
    upgrade_from_0013(postgres_url)
