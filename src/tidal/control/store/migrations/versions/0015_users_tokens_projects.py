"""Users' tokens in a table of their own (several a user, each with a label, a time to live, revocable), projects
and their members, and the limits an admin sets per user and per project.

Every user's token moves to ``user_tokens`` (the same sha256: the token keeps working). The projects that
existing jobs were submitted under become projects, each with the users who submitted there as members, so that
they may go on submitting there; ``default`` is made (open to every user).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from __future__ import annotations

import re
import secrets

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# As tidal.control.projects.NAME (a migration keeps its own copy: it must not change with the code).
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def upgrade() -> None:
    op.create_table(
        "user_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("username", sa.String(64), nullable=False, index=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True, index=True),
        sa.Column("label", sa.String(64), nullable=True),
        sa.Column("ttl_s", sa.Float, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(64), nullable=True),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("revoked_at", sa.Float, nullable=True),
        sa.Column("last_used_at", sa.Float, nullable=True),
    )
    op.create_table(
        "projects",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(64), nullable=True),
        sa.Column("limits", sa.JSON, nullable=False, server_default="{}"),
    )
    op.create_table(
        "project_members",
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("username", sa.String(64), primary_key=True, index=True),
        sa.Column("added_at", sa.Float, nullable=False),
    )
    conn = op.get_bind()
    users = conn.execute(sa.text("SELECT name, role, token_hash, created_at FROM users")).all()
    tokens = sa.table("user_tokens", *(sa.column(c) for c in ("id", "username", "token_hash", "label", "created_at")))
    for name, _role, token_hash, created_at in users:
        conn.execute(sa.insert(tokens).values(id=f"tk-{secrets.token_hex(6)}", username=name, token_hash=token_hash,
                                              label="initial", created_at=created_at))
    with op.batch_alter_table("users") as b:
        b.drop_index("ix_users_token_hash")
        b.drop_column("token_hash")
        b.add_column(sa.Column("limits", sa.JSON, nullable=False, server_default="{}"))
    with op.batch_alter_table("jobs") as b:
        b.create_index("ix_jobs_owner_state", ["owner", "state"])

    # Projects: those of existing jobs (with their submitters), and default.
    at = max((float(c) for *_, c in users), default=0.0)
    people = {name for name, role, *_ in users if role in ("user", "admin")}
    project = (sa.text("json_extract(spec, '$.project')") if conn.dialect.name == "sqlite"
               else sa.text("spec->>'project'"))
    used = conn.execute(sa.select(sa.column("owner"), project).select_from(sa.table("jobs")).distinct()).all()
    projects = sa.table("projects", sa.column("name"), sa.column("created_at"))
    members = sa.table("project_members", sa.column("project"), sa.column("username"), sa.column("added_at"))
    names = {"default"} | {p for _, p in used if p and _PROJECT.fullmatch(p)}
    for name in sorted(names):
        conn.execute(sa.insert(projects).values(name=name, created_at=at))
    for owner, name in sorted({(o, p) for o, p in used if o in people and p in names and p != "default"}):
        conn.execute(sa.insert(members).values(project=name, username=owner, added_at=at))


def downgrade() -> None:
    # A user keeps one token: its newest that works (others, and expiry, are lost); one without gets none.
    conn = op.get_bind()
    with op.batch_alter_table("jobs") as b:
        b.drop_index("ix_jobs_owner_state")
    with op.batch_alter_table("users") as b:
        b.drop_column("limits")
        b.add_column(sa.Column("token_hash", sa.String(64), nullable=True))
    kept: dict[str, str] = {}
    for user, token_hash in conn.execute(sa.text(
            "SELECT username, token_hash FROM user_tokens WHERE revoked_at IS NULL ORDER BY created_at")):
        kept[user] = token_hash
    for (name,) in conn.execute(sa.text("SELECT name FROM users")).all():
        token_hash = kept.get(name) or f"none-{secrets.token_hex(27)}"  # matches no token's sha256
        conn.execute(sa.text("UPDATE users SET token_hash = :h WHERE name = :n"), {"h": token_hash, "n": name})
    with op.batch_alter_table("users") as b:
        b.alter_column("token_hash", existing_type=sa.String(64), nullable=False)
        b.create_index("ix_users_token_hash", ["token_hash"], unique=True)
    op.drop_table("project_members")
    op.drop_table("projects")
    op.drop_table("user_tokens")
