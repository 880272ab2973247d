"""Alembic environment: the connection is handed in by :func:`tidal.control.store.db.migrate`."""

from __future__ import annotations

from alembic import context

from tidal.control.store.models import Base
from tidal.errors import ConfigError

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise ConfigError("Tidal's database migrations need the connection that tidal.control.store.db.migrate() "
                      "hands them", hint="run them through tidal.control.store.db.migrate() (the control plane "
                      "does at start), not with the alembic command")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
