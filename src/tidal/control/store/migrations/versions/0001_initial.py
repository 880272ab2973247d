"""Initial schema: users, nodes, jobs, actions, events, checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("unix_user", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_users_token_hash", "users", ["token_hash"], unique=True)
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("devices", sa.Integer, nullable=False),
        sa.Column("cpus", sa.JSON, nullable=False),
        sa.Column("agent_id", sa.String(64), nullable=False),
        sa.Column("lease_until", sa.Float, nullable=False),
        sa.Column("up", sa.Boolean, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("ranks", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("held", sa.Boolean, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("placement", sa.JSON, nullable=False),
        sa.Column("target", sa.JSON, nullable=True),
        sa.Column("op", sa.String(64), nullable=True),
        sa.Column("op_purpose", sa.String(16), nullable=True),
        sa.Column("last_checkpoint_at", sa.Float, nullable=True),
    )
    op.create_index("ix_jobs_seq", "jobs", ["seq"])
    op.create_index("ix_jobs_owner", "jobs", ["owner"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "actions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("agent_id", sa.String(64), nullable=True),
        sa.Column("cause", sa.String(64), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("done_at", sa.Float, nullable=True),
        sa.Column("result", sa.JSON, nullable=True),
    )
    op.create_index("ix_actions_job_id", "actions", ["job_id"])
    op.create_index("ix_actions_node", "actions", ["node"])
    op.create_index("ix_actions_status", "actions", ["status"])
    op.create_table(
        "events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("node", sa.String(128), nullable=True),
        sa.Column("cause", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
        sa.Column("retained", sa.Boolean, nullable=False),
    )
    op.create_index("ix_checkpoints_job_id", "checkpoints", ["job_id"])


def downgrade() -> None:
    for t in ("checkpoints", "events", "actions", "jobs", "nodes", "users"):
        op.drop_table(t)
