"""A database that cannot be reached: the control plane answers 503 with a message (the request was not
carried out, or, where the connection was lost at the commit, may have been), and connects again once the
database is back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select
from sqlalchemy.exc import IntegrityError, OperationalError

from tidal.control import tokens
from tidal.control.api.app import Context, create_app
from tidal.control.client import ControlPlaneError, error_for
from tidal.control.store.db import Database
from tidal.control.store.models import User
from tidal.errors import Unavailable
from tidal.testing.postgres import PostgresServer


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    d = Database(f"sqlite:///{tmp_path / 'tidal.db'}")
    d.migrate()
    yield d
    d.close()


def _lost(*_: Any) -> None:
    raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


def test_a_connection_lost_at_the_commit_is_in_doubt(db: Database) -> None:
    event.listen(db.engine, "commit", _lost)
    with pytest.raises(Unavailable) as err, db.tx() as s:
        tokens.create_user(s, "alice", "user")
    assert err.value.fields == {"in_doubt": True}
    assert "may or may not have been made" in err.value.message
    event.remove(db.engine, "commit", _lost)
    with db.tx() as s:  # the next transaction goes through
        tokens.create_user(s, "bob", "user")


def test_a_connection_lost_before_the_commit_changed_nothing(db: Database) -> None:
    event.listen(db.engine, "before_cursor_execute", _lost)
    with pytest.raises(Unavailable) as err, db.tx() as s:
        tokens.create_user(s, "alice", "user")
    assert err.value.fields == {"in_doubt": False} and err.value.status_code == 503
    with pytest.raises(Unavailable), db.read() as s:
        s.scalars(select(User)).all()
    event.remove(db.engine, "before_cursor_execute", _lost)
    with db.read() as s:
        assert s.scalars(select(User)).all() == []


def test_other_database_errors_are_not_unavailability(db: Database) -> None:
    with db.tx() as s:
        tokens.create_user(s, "alice", "user")
    with pytest.raises(IntegrityError), db.tx() as s:
        s.add(User(name="alice", role="user", created_at=0.0))


@pytest.mark.postgres
def test_the_api_answers_503_while_postgres_is_down_and_reconnects() -> None:
    server = PostgresServer()  # its own: this test stops it
    try:
        db = Database(server.create_database("tidal"))
        db.migrate()
        with db.tx() as s:
            token = tokens.create_user(s, "alice", "user")
        auth = {"Authorization": f"Bearer {token}"}
        job = {"command": ["train"], "workdir": "/tmp"}
        with TestClient(create_app(Context(db=db, home=Path("/nonexistent")))) as http:
            assert http.post("/v1/jobs", headers=auth, json=job).status_code == 201
            server.shutdown("fast")  # its connections in the pool are gone with it
            for r in (http.post("/v1/jobs", headers=auth, json=job), http.get("/v1/jobs", headers=auth)):
                assert r.status_code == 503 and r.headers["Retry-After"] == "1"
                body = r.json()
                assert body["error"] == "Unavailable" and body["in_doubt"] is False
                assert body["message"] == "the control plane's database is unavailable: the request was not " \
                                          "carried out"
                assert str(server.port) not in r.text  # where the database is stays in the server's log
                err = error_for(r.status_code, body)  # what the CLI shows
                assert isinstance(err, ControlPlaneError) and err.hint == "try again in a moment"
            server.start()
            assert http.post("/v1/jobs", headers=auth, json=job).status_code == 201
            assert len(http.get("/v1/jobs", headers=auth).json()) == 2
        db.close()
    finally:
        server.stop()
