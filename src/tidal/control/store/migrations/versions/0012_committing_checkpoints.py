"""A checkpoint may be recorded before its commit has ended (state ``committing``): a resize or a move within
one node restores the job from the images dumped there while they are committed to the store. It is no
checkpoint to fall back to until its agent reports it committed.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("checkpoint_state", type_="check")
        batch.create_check_constraint("checkpoint_state", "state IN ('committed', 'bad', 'committing')")


def downgrade() -> None:
    # Never committed: no checkpoint of its job that an older release could restore.
    op.execute("DELETE FROM checkpoints WHERE state = 'committing'")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("checkpoint_state", type_="check")
        batch.create_check_constraint("checkpoint_state", "state IN ('committed', 'bad')")
