"""Nodes joining over the network: join tokens (single-node, hashed, expiring, revocable; exchanged once for
the node's own credential), and the address a node's agent advertises for the traffic between nodes.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("node", sa.String(128), nullable=False, index=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True, index=True),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("used_at", sa.Float, nullable=True),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("advertise_addr", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("advertise_addr")
    op.drop_table("join_tokens")
