"""Why a waiting job waits: the policy's reason (its code and its text), kept with the job while it waits.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Jobs waiting at the upgrade get their reason at the scheduler's first pass.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("reason_code", sa.String(16), nullable=True))
        batch.add_column(sa.Column("reason", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reason")
        batch.drop_column("reason_code")
