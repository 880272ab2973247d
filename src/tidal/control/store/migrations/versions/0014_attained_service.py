"""Jobs' attained service (the device-seconds their ranks have run, folded in as each run ends, which the
scheduler orders basic work by and subtracts from a job's given run time) and the cluster each was last placed
in (which the scheduler prefers when it resumes the job: its checkpoint is there).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Jobs of an older database start from none: their earlier runs were not counted.
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("attained_device_s", sa.Float, nullable=False, server_default="0"))
        b.add_column(sa.Column("last_cluster", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.drop_column("last_cluster")
        b.drop_column("attained_device_s")
