"""Exported metrics that survive restarts: the series folded from the event log, what the fold keeps of each
job, and each node's count of lease renewals.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The fold starts at the first event: the history already recorded is counted at the first scrape.
    op.create_table(
        "metric_series",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("labels", sa.String(512), primary_key=True),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_table(
        "metric_jobs",
        sa.Column("job_id", sa.String(32), primary_key=True),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("ranks", sa.Integer, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started", sa.Boolean, nullable=False),
        sa.Column("run_s", sa.Float, nullable=False),
        sa.Column("running_since", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("open", sa.JSON, nullable=False),
    )
    op.create_index("ix_metric_jobs_finished_at", "metric_jobs", ["finished_at"])
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("lease_renewals", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("lease_renewals")
    op.drop_index("ix_metric_jobs_finished_at", "metric_jobs")
    op.drop_table("metric_jobs")
    op.drop_table("metric_series")
