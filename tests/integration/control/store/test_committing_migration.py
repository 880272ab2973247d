"""Migration 0012 (checkpoints recorded while their commit runs) on SQLite and PostgreSQL: a checkpoint may be
``committing`` after it, a state outside the three is still refused, and the downgrade removes the ones never
committed (no older release could restore them) and keeps the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.control.store.revisions import to
from tidal.control.store.db import Database

CHECKPOINTS = sa.table("checkpoints", *(sa.column(c) for c in ("id", "job_id", "created_at", "bytes", "stored_bytes",
                                                               "retained", "state")))


def add(db: Database, ck: str, state: str) -> None:
    with db.engine.begin() as conn:
        conn.execute(sa.insert(CHECKPOINTS).values(id=ck, job_id="j1", created_at=1.0, bytes=1, stored_bytes=1,
                                                   retained=True, state=state))


def states(db: Database) -> dict[str, str]:
    with db.engine.begin() as conn:
        return dict(conn.execute(sa.select(CHECKPOINTS.c.id, CHECKPOINTS.c.state)).all())


def upgrade_from_0011(url: str) -> None:
    db = Database(url)
    to(db, "0011")
    add(db, "c1", "committed")
    with pytest.raises(sa.exc.IntegrityError):
        add(db, "c2", "committing")
    db.migrate()
    add(db, "c2", "committing")
    with pytest.raises(sa.exc.IntegrityError):
        add(db, "c3", "half")
    assert states(db) == {"c1": "committed", "c2": "committing"}
    to(db, "0011", up=False)
    assert states(db) == {"c1": "committed"}
    with pytest.raises(sa.exc.IntegrityError):
        add(db, "c2", "committing")
    db.migrate()
    db.close()


def test_migration_0012_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0011(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0012_on_postgres(postgres_url: str) -> None:
    upgrade_from_0011(postgres_url)
