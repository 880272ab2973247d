"""Jobs' environments hold no TIDAL_* variables: the CLI used to send the submitter's whole environment,
TIDAL_TOKEN included, and the database kept it with the job's spec and its launch actions. Tokens
themselves were always stored as sha256 only (users.token_hash).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

PREFIX = "TIDAL_"  # tidal.core.spec.RESERVED_ENV_PREFIX, copied: a migration must not change with the code


def _scrubbed(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The document without reserved variables in its ``env``, or None when it has none."""
    env = (doc or {}).get("env")
    if not isinstance(env, dict) or not any(str(k).upper().startswith(PREFIX) for k in env):
        return None
    assert doc is not None
    return {**doc, "env": {k: v for k, v in env.items() if not str(k).upper().startswith(PREFIX)}}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # The rows rewritten below must not stay readable in the file's free pages.
        bind.exec_driver_sql("PRAGMA secure_delete = ON")
    for table, key, column in (("jobs", "id", "spec"), ("actions", "id", "payload")):
        t = sa.table(table, sa.column(key, sa.String), sa.column(column, sa.JSON))
        # Only rows whose text mentions the prefix at all ('_' matches any character: a superset).
        maybe = sa.func.lower(sa.cast(t.c[column], sa.Text)).like(f"%{PREFIX.lower()}%")
        for row_id, doc in bind.execute(sa.select(t.c[key], t.c[column]).where(maybe)).all():
            new = _scrubbed(doc)
            if new is not None:
                bind.execute(sa.update(t).where(t.c[key] == row_id).values({column: new}))


def downgrade() -> None:
    pass  # the removed secrets are not restored
