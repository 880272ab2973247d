"""Migration 0016 (drained nodes) on SQLite and PostgreSQL: a node from before it is not drained and has lost no
lease, both are stored, and it downgrades."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.control.store.revisions import columns, to
from tidal.control.store.db import Database
from tidal.control.store.models import NodeRow

NEW = {"lease_losses", "drain", "drain_reason", "drained_by", "drained_at"}


def upgrade_from_0015(url: str) -> None:
    db = Database(url)
    to(db, "0015")
    nodes = sa.table("nodes", *(sa.column(c) for c in ("name", "region", "cluster", "devices", "agent_id",
                                                      "lease_until", "up", "registered_at")),
                     sa.column("cpus", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(nodes).values(name="n1", region="r", cluster="c", devices=1, cpus=[[0]], agent_id="a",
                                             lease_until=10.0, up=True, registered_at=1.0))
    assert not NEW & columns(db, "nodes")
    db.migrate()
    with db.tx() as s:
        node = s.get(NodeRow, "n1")
        assert node is not None
        assert (node.lease_losses, node.drain, node.drain_reason, node.drained_by, node.drained_at) == (
            None, None, None, None, None)
        node.lease_losses, node.drain, node.drain_reason, node.drained_by, node.drained_at = (
            [5.0, 6.0], "admin", "disk swap", "root", 7.0)
    with db.read() as s:
        node = s.get(NodeRow, "n1")
        assert node is not None
        assert (node.lease_losses, node.drain, node.drain_reason, node.drained_by, node.drained_at) == (
            [5.0, 6.0], "admin", "disk swap", "root", 7.0)
    to(db, "0015", up=False)
    assert not NEW & columns(db, "nodes")
    db.migrate()
    assert columns(db, "nodes") >= NEW
    db.close()


def test_migration_0016_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0015(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0016_on_postgres(postgres_url: str) -> None:
    upgrade_from_0015(postgres_url)
