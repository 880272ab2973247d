"""Migration 0015 (users' tokens in their own table, projects and members, limits) on SQLite and PostgreSQL: a user
of a database at 0014 keeps their token working, the projects existing jobs were submitted under are made with
their submitters as members, and it downgrades (a user keeps a token that works)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.integration.control.store.revisions import columns, tables, to
from tidal.control import tokens
from tidal.control.api.app import Context, create_app
from tidal.control.store.db import Database
from tidal.control.store.models import Project, ProjectMember, UserToken

TOKEN = "tdl_an-old-token-of-alice"
NEW = {"user_tokens", "projects", "project_members"}


def upgrade_from_0014(url: str, home: Path) -> None:
    db = Database(url)
    to(db, "0014")
    users = sa.table("users", sa.column("name"), sa.column("role"), sa.column("token_hash"), sa.column("unix_user"),
                     sa.column("created_at"))
    jobs = sa.table("jobs", *(sa.column(c) for c in ("id", "seq", "name", "owner", "tier", "ranks", "state", "held",
                                                     "submitted_at", "restarts", "attempt")),
                    sa.column("placement", sa.JSON), sa.column("spec", sa.JSON))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(users), [
            {"name": "alice", "role": "user", "token_hash": hashlib.sha256(TOKEN.encode()).hexdigest(),
             "unix_user": None, "created_at": 10.0},
            {"name": "cluster", "role": "agent", "token_hash": "c" * 64, "unix_user": None, "created_at": 5.0}])
        for i, (owner, project) in enumerate((("alice", "vision"), ("alice", "vision"), ("alice", "../x"),
                                              ("alice", None), ("gone", "speech"))):
            spec = {"command": ["t"], "workdir": "/w", **({"project": project} if project else {})}
            conn.execute(sa.insert(jobs).values(id=f"j{i}", seq=i, name="t", owner=owner, tier="basic", ranks=1,
                                                state="succeeded", held=False, submitted_at=1.0, restarts=0,
                                                attempt=1, placement=[], spec=spec))
    assert "token_hash" in columns(db, "users") and not NEW & tables(db)
    db.migrate()
    assert "token_hash" not in columns(db, "users")
    assert tables(db) >= NEW
    with db.read() as s:
        (row,) = s.query(UserToken).filter(UserToken.username == "alice").all()
        assert (row.label, row.created_at, row.expires_at, row.revoked_at) == ("initial", 10.0, None, None)
        assert row.id.startswith("tk-") and tokens.lookup(s, TOKEN) is not None
        # The projects of the jobs: valid names only (a job's "../x" is not a project), with their submitters
        # who are users still.
        assert [p.name for p in s.query(Project).order_by(Project.name)] == ["default", "speech", "vision"]
        assert [(m.project, m.username) for m in s.query(ProjectMember)] == [("vision", "alice")]
    # The token works through the API, and alice may submit under vision as she did.
    with TestClient(create_app(Context(db=db, home=home))) as http:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert http.get("/v1/whoami", headers=auth).json() == {"name": "alice", "role": "user"}
        r = http.post("/v1/jobs", headers=auth, json={"command": ["t"], "workdir": str(home), "project": "vision"})
        assert r.status_code == 201, r.text
        new = http.post("/v1/users/alice/tokens", headers=auth, json={"label": "later"}).json()
    to(db, "0014", up=False)
    assert "token_hash" in columns(db, "users") and not NEW & tables(db)
    with db.engine.connect() as conn:
        kept = dict(conn.execute(sa.text("SELECT name, token_hash FROM users")).all())
    # A user keeps one token: their newest that works.
    assert kept["alice"] == hashlib.sha256(new["token"].encode()).hexdigest() and kept["cluster"] == "c" * 64
    db.migrate()
    with db.read() as s:
        assert tokens.lookup(s, new["token"]) is not None
    db.close()


def test_migration_0015_on_sqlite(tmp_path: Path) -> None:
    upgrade_from_0014(f"sqlite:///{tmp_path / 'old.db'}", tmp_path)


@pytest.mark.postgres
def test_migration_0015_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    upgrade_from_0014(postgres_url, tmp_path)
