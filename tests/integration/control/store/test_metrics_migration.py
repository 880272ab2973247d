"""Migration 0009 (the metrics' tables, each node's lease renewals) on SQLite and PostgreSQL: a database from
before it keeps its nodes (with no renewals counted) and its event log, which the first fold counts; and it
downgrades."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.control.store.revisions import tables as tables_of
from tests.integration.control.store.revisions import to
from tidal.control import tally
from tidal.control.history import record
from tidal.control.store.db import Database
from tidal.control.store.models import NodeRow


def upgrade_from_0008(url: str) -> None:
    db = Database(url)

    def tables() -> set[str]:
        return tables_of(db)

    to(db, "0008")
    nodes = sa.table("nodes", *(sa.column(c) for c in ("name", "region", "cluster", "devices", "agent_id",
                                                       "lease_until", "up", "registered_at")),
                     sa.column("cpus", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(nodes).values(name="n1", region="r", cluster="c", devices=1, cpus=[[0]],
                                             agent_id="a", lease_until=1.0, up=True, registered_at=1.0))
    with db.tx() as s:
        record(s, "node_down", node="n1", detail="lease expired")
    assert "metric_series" not in tables()
    db.migrate()
    with db.tx() as s:
        node = s.get(NodeRow, "n1")
        assert node is not None and node.lease_renewals == 0
        assert tally.fold(s) == 1  # the history recorded before the upgrade is counted
    with db.read() as s:
        (row,) = tally.series(s)
        assert (row.name, row.labels, row.data) == ("tidal_lease_losses_total", '{"cause":"expired"}', {"v": 1.0})
    to(db, "0008", up=False)
    assert not {"metric_series", "metric_jobs"} & tables()
    db.migrate()
    assert {"metric_series", "metric_jobs"} <= tables()
    db.close()


def test_migration_0009_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0008(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0009_on_postgres(postgres_url: str) -> None:
    upgrade_from_0008(postgres_url)
