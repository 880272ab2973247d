"""Regions with a checkpoint store each (``tidal server --store REGION=URL``): the regions whose store holds
a checkpoint, and a job's operation may pre-copy its last checkpoint into another region's store first (the
phase ``precopy``).

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

# Copied, not imported: a migration must not change with the code.
PHASES = ("idle", "starting", "checkpoint", "cut", "park", "dump", "finish", "failing")
NEW_PHASES = (*PHASES, "precopy")


def _phases(names: tuple[str, ...]) -> str:
    return f"phase IN ({', '.join(repr(p) for p in names)})"


def upgrade() -> None:
    # NULL for the checkpoints taken before: one store for every region, as the control plane had then.
    with op.batch_alter_table("checkpoints") as t:
        t.add_column(sa.Column("regions", sa.JSON, nullable=True))
    with op.batch_alter_table("jobs") as t:
        t.drop_constraint("job_phase", type_="check")
        t.create_check_constraint("job_phase", _phases(NEW_PHASES))


def downgrade() -> None:
    conn = op.get_bind()
    jobs = sa.table("jobs", sa.column("phase", sa.String))
    conn.execute(sa.update(jobs).where(jobs.c.phase == "precopy").values(phase="idle"))
    with op.batch_alter_table("jobs") as t:
        t.drop_constraint("job_phase", type_="check")
        t.create_check_constraint("job_phase", _phases(PHASES))
    with op.batch_alter_table("checkpoints") as t:
        t.drop_column("regions")
