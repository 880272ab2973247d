"""GPU devices: a node whose devices are NVIDIA GPUs (``tidal agent --devices auto``) keeps each device's GPU
(index, UUID, model, memory); NULL for nodes of CPU devices, as every node registered before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as t:
        t.add_column(sa.Column("gpus", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as t:
        t.drop_column("gpus")
