"""Jobs spread over several nodes: actions belong to an operation (one per node), a checkpoint is made
of parts (one per node), and a job remembers its multi-step operation, its ranks' exits and the number
of devices a user pinned it to (resize).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.add_column(sa.Column("op", sa.String(64), nullable=True))
        batch.create_index("ix_actions_op", ["op"])
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("parts", sa.JSON, nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("opstate", sa.JSON, nullable=True))
        batch.add_column(sa.Column("exited", sa.JSON, nullable=True))
        batch.add_column(sa.Column("pinned_devices", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pinned_devices")
        batch.drop_column("exited")
        batch.drop_column("opstate")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("parts")
    with op.batch_alter_table("actions") as batch:
        batch.drop_index("ix_actions_op")
        batch.drop_column("op")
