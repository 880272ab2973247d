"""A PostgreSQL host that drops off the network (its packets dropped, not refused): the control plane's
database calls fail within seconds with a clear 503 error instead of waiting for the kernel's TCP timeout
(about 15 minutes) while holding every transaction, agents' heartbeats included; and they succeed again once
the host is back."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from tidal.control.store.db import PG_TIMEOUTS, Database, network_timeouts
from tidal.control.store.models import User
from tidal.errors import Unavailable
from tidal.testing.hosts import TestNet
from tidal.testing.postgres import PostgresServer

pytestmark = pytest.mark.postgres


def test_timeouts_apply_to_postgresql_only_and_yield_to_the_url() -> None:
    assert network_timeouts("sqlite:////tmp/x.db") == {}
    assert network_timeouts("postgresql+psycopg://tidal@db/tidal") == PG_TIMEOUTS
    mine = network_timeouts("postgresql+psycopg://tidal@db/tidal?connect_timeout=20")
    assert "connect_timeout" not in mine and mine["tcp_user_timeout"] == 10_000


@pytest.mark.parametrize("test_net", [["db"]], indirect=True)
def test_an_unreachable_database_fails_fast_and_comes_back(test_net: TestNet) -> None:
    pg = PostgresServer(host=test_net["db"])
    db = Database(pg.create_database("tidal"))
    try:
        db.migrate()
        with db.read() as s:  # a pooled connection, established
            assert s.scalars(select(User)).all() == []

        test_net["db"].link_down()
        for what in ("the pooled connection", "a new connection"):
            t0 = time.monotonic()
            with pytest.raises(Unavailable, match="the control plane's database is unavailable"), db.read() as s:
                s.scalars(select(User)).all()
            took = time.monotonic() - t0
            assert took < 30, f"{what}: failed only after {took:.0f}s"

        test_net["db"].link_up()
        with db.read() as s:
            assert s.scalars(select(User)).all() == []
    finally:
        db.close()
