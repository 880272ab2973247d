"""Migration 0008 (why a job waits) on SQLite and PostgreSQL: a job from before it has no reason until the
scheduler's next pass, the reason is stored, and it downgrades."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.control.store.revisions import columns as columns_of
from tests.integration.control.store.revisions import to
from tidal.control.store.db import Database
from tidal.control.store.models import JobRow


def upgrade_from_0007(url: str) -> None:
    db = Database(url)

    def columns() -> set[str]:
        return columns_of(db, "jobs")

    to(db, "0007")
    jobs = sa.table("jobs", *(sa.column(c) for c in ("id", "seq", "name", "owner", "tier", "ranks", "state", "held",
                                                     "submitted_at", "restarts", "attempt")),
                    sa.column("placement", sa.JSON), sa.column("spec", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(jobs).values(id="j1", seq=1, name="t", owner="u", tier="basic", ranks=1,
                                            state="pending", held=False, submitted_at=1.0, restarts=0, attempt=0,
                                            placement=[], spec={"command": ["t"], "workdir": "/w"}))
    assert "reason" not in columns()
    db.migrate()
    with db.tx() as s:
        job = s.get(JobRow, "j1")
        assert job is not None and job.reason is None and job.reason_code is None
        job.reason_code, job.reason = "no_devices", "needs 2 free device(s), 1 free"
    with db.read() as s:
        assert s.get(JobRow, "j1").reason == "needs 2 free device(s), 1 free"  # type: ignore[union-attr]
    to(db, "0007", up=False)
    assert not {"reason", "reason_code"} & columns()
    db.migrate()
    assert {"reason", "reason_code"} <= columns()
    db.close()


def test_migration_0008_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0007(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0008_on_postgres(postgres_url: str) -> None:
    upgrade_from_0007(postgres_url)
