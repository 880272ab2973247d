"""A process a rank forks (a DataLoader's worker) holds no copy of the process groups' sockets: a copy would
keep a connection open after the rank's teardown, and CRIU cannot dump it."""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tidal.mechanisms.interpose import rankside


class Group(rankside.TidalGroupBase):
    def __init__(self) -> None:
        before = rankside._sockets()
        self._inner: Any = socket.create_server(("127.0.0.1", 0))
        self._opened = rankside._sockets() - before


def _report(conn: Any) -> None:
    conn.send(sorted(rankside._sockets()))


@pytest.fixture
def interposer(monkeypatch: pytest.MonkeyPatch) -> Iterator[rankside.Interposer]:
    req_r, req_w = os.pipe()
    ip = rankside.Interposer(req_r, req_w, None, "test")
    monkeypatch.setattr(rankside, "IP", ip)
    yield ip
    for g in ip.groups:
        g._inner.close()
    os.close(req_r)
    os.close(req_w)


def test_a_forked_child_closes_its_copies_of_the_groups_sockets_and_the_rank_keeps_its_own(
        interposer: rankside.Interposer) -> None:
    os.register_at_fork(after_in_child=rankside._after_fork_in_child)  # as install() does
    group = Group()
    interposer.groups.append(group)
    mine = socket.create_server(("127.0.0.1", 0))  # not a group's: the child keeps it
    mine_name = os.readlink(f"/proc/self/fd/{mine.fileno()}")
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_report, args=(child,))
    p.start()
    in_child = set(parent.recv())
    p.join(10)
    assert p.exitcode == 0
    assert not in_child & group._opened
    assert mine_name in in_child
    # The rank's own socket still works.
    assert group._opened <= rankside._sockets()
    socket.create_connection(group._inner.getsockname(), timeout=5).close()
    mine.close()
