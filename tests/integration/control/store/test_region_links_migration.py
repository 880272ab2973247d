"""Migration 0013 (the measured links between regions) on SQLite and PostgreSQL: a database from before it gets
the table, empty (the scheduler counts on TIDAL_REGION_GBPS or its default until a copy is timed); the rates
kept there survive a restart of the control plane (a new Database over the same URL); and it downgrades."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.control.store.revisions import tables, to
from tidal.control import linkrates
from tidal.control.store.db import Database
from tidal.core import Links


def upgrade_from_0012(url: str) -> None:
    db = Database(url)
    to(db, "0012")
    assert "region_links" not in tables(db)
    db.migrate()
    with db.tx() as s:
        assert linkrates.measured(s) == {}
        assert linkrates.note(s, "west", "east", 2_000_000_000, 4.0) == 0.5
        assert linkrates.note(s, "west", "east", 1_000_000_000, 0.5) == 1.25
        assert linkrates.note(s, "east", "west", 5 << 20, 1.0) is None  # too small to time
    db.close()
    again = Database(url)  # the control plane restarted
    again.migrate()
    with again.read() as s:
        assert linkrates.measured(s) == {("west", "east"): 1.25}
        assert linkrates.links(s, Links(region_gbps=0.2)).between("west", "east") == 1.25
        (row,) = linkrates.listing(s)
        assert {k: v for k, v in row.items() if k != "measured_at"} == {
            "from": "west", "to": "east", "gbps": 1.25, "copies": 2, "samples": 2}
    to(again, "0012", up=False)
    assert "region_links" not in tables(again)
    again.migrate()
    with again.read() as s:
        assert linkrates.measured(s) == {}
    again.close()


def test_migration_0013_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0012(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0013_on_postgres(postgres_url: str) -> None:
    upgrade_from_0012(postgres_url)
