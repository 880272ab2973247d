"""Checkpoints have a state (committed, or bad: failed verification on restore, kept for inspection), and
a job may be set to resume from a chosen checkpoint.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        # Every checkpoint recorded so far was committed.
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="committed"))
        batch.create_check_constraint("checkpoint_state", "state IN ('committed', 'bad')")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("resume_from", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("resume_from")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("checkpoint_state", type_="check")
        batch.drop_column("state")
