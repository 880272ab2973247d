"""Drained nodes: the last times a node's lease was lost, and whether it is drained (automatically, for losing
its lease too often, or by an admin), why, by whom and since when. Nodes of an older database are not drained
and have lost no lease.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as b:
        b.add_column(sa.Column("lease_losses", sa.JSON, nullable=True))
        b.add_column(sa.Column("drain", sa.String(16), nullable=True))
        b.add_column(sa.Column("drain_reason", sa.String(512), nullable=True))
        b.add_column(sa.Column("drained_by", sa.String(64), nullable=True))
        b.add_column(sa.Column("drained_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as b:
        for name in ("drained_at", "drained_by", "drain_reason", "drain", "lease_losses"):
            b.drop_column(name)
