"""A job's operation phase is a typed column (tidal.core.operations.Phase), no longer a string inside
``opstate``. Orders of unfinished actions are stored in the typed protocol's form, with their kind.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Copied, not imported: a migration must not change with the code.
PHASES = ("idle", "starting", "checkpoint", "cut", "park", "dump", "finish", "failing")
# opstate["phase"] as written before this revision → the phase; no opstate with an order in flight: starting
# (a launch or restore) when its purpose says so, else idle.
OLD = {"single": "checkpoint", "cut": "cut", "park": "park", "dump": "dump", "finish": "finish",
       "failing": "failing"}


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("phase", sa.String(16), nullable=False, server_default="idle"))
        batch.create_check_constraint("job_phase", f"phase IN ({', '.join(repr(p) for p in PHASES)})")
    conn = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("opstate", sa.JSON),
                    sa.column("op", sa.String), sa.column("op_purpose", sa.String), sa.column("phase", sa.String))
    for jid, opstate, op_, purpose in conn.execute(sa.select(jobs.c.id, jobs.c.opstate, jobs.c.op,
                                                             jobs.c.op_purpose)).all():
        phase = OLD.get(str((opstate or {}).get("phase")))
        if phase is None:
            phase = "starting" if op_ is not None and purpose in ("launch", "restore") else "idle"
        conn.execute(sa.update(jobs).where(jobs.c.id == jid).values(phase=phase))
    actions = sa.table("actions", sa.column("id", sa.String), sa.column("kind", sa.String),
                       sa.column("payload", sa.JSON), sa.column("status", sa.String))
    for aid, kind, payload in conn.execute(sa.select(actions.c.id, actions.c.kind, actions.c.payload)
                                           .where(actions.c.status.in_(("pending", "sent")))).all():
        # "keep" was never read by agents; the typed order names its kind.
        order = {k: v for k, v in (payload or {}).items() if k != "keep"} | {"kind": kind}
        conn.execute(sa.update(actions).where(actions.c.id == aid).values(payload=order))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("job_phase", type_="check")
        batch.drop_column("phase")
