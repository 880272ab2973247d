"""The regions whose checkpoint store holds a checkpoint (``tidal server --store REGION=URL``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for the checkpoints taken before: one store for every region, as the control plane had then.
    with op.batch_alter_table("checkpoints") as t:
        t.add_column(sa.Column("regions", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as t:
        t.drop_column("regions")
