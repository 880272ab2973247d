"""Alembic environment: the connection is handed in by :func:`tidal.control.store.db.migrate`."""

from __future__ import annotations

from alembic import context

from tidal.control.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through tidal.control.store.db.migrate()")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
