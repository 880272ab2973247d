"""The database's connection pool on PostgreSQL: a connection that sat idle is tested before it is used
(the server may have gone away meanwhile); one used just now is not (a round trip per transaction)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from tidal.control.store import db as dbmod
from tidal.control.store.db import Database
from tidal.testing.postgres import PostgresServer


def counting_pings(monkeypatch: pytest.MonkeyPatch, database: Database) -> list[int]:
    pings: list[int] = []
    ping = database.engine.dialect.do_ping

    def counted(conn: Any) -> bool:
        pings.append(1)
        return ping(conn)

    monkeypatch.setattr(database.engine.dialect, "do_ping", counted)
    return pings


def test_a_connection_used_just_now_is_not_tested_again(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    database = Database(postgres_url)
    pings = counting_pings(monkeypatch, database)
    for _ in range(5):
        with database.tx() as s:
            assert s.scalar(text("select 1")) == 1
    assert pings == []
    monkeypatch.setattr(dbmod, "PING_IDLE_S", 0.0)  # every pooled connection counts as idle
    with database.tx() as s:
        assert s.scalar(text("select 1")) == 1
    assert pings == [1]
    database.engine.dispose()


def test_an_idle_connection_lost_to_a_server_restart_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    server = PostgresServer()  # its own: it is restarted
    try:
        database = Database(server.create_database("pool"))
        with database.tx() as s:
            assert s.scalar(text("select 1")) == 1
        server.restart()
        monkeypatch.setattr(dbmod, "PING_IDLE_S", 0.0)
        with database.tx() as s:
            assert s.scalar(text("select 1")) == 1
        database.engine.dispose()
    finally:
        server.stop()
