"""Moving a test database to a given schema revision (to put rows in it as an older release wrote them, then
upgrade, or to downgrade), and what its schema holds then."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from tidal.control.store.db import MIGRATIONS, Database


def to(db: Database, revision: str, up: bool = True) -> None:
    """Upgrade (or with ``up=False`` downgrade) ``db`` to ``revision``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.upgrade if up else command.downgrade)(cfg, revision)


def columns(db: Database, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(db.engine).get_columns(table)}


def tables(db: Database) -> set[str]:
    return set(sa.inspect(db.engine).get_table_names())
