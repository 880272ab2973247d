"""The measured links between regions: the last copies of checkpoints from one region's store to another's,
timed, from which the scheduler's estimate of a move's transfer takes its rate (``tidal.control.linkrates``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Empty: until a copy between two regions is timed, the scheduler counts on TIDAL_REGION_GBPS or its default.
    op.create_table(
        "region_links",
        sa.Column("source", sa.String(64), primary_key=True),
        sa.Column("target", sa.String(64), primary_key=True),
        sa.Column("samples", sa.JSON, nullable=False),
        sa.Column("copies", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("region_links")
