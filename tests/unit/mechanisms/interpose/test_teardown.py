"""The cut's teardown leaves no socket of the process groups behind, or says which is left: the interposer of
a rank (this process, with stand-in groups that hold real TCP sockets) and its owner's side of the channel,
over real pipes. CRIU cannot dump an internet socket in any state on Linux >= 6.16."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tidal.errors import CheckpointError
from tidal.mechanisms.interpose import rankside
from tidal.mechanisms.interpose.channel import RankChannel, cut, new_epoch, resume


class Conn:
    """What a kept work holds of its group: the socket, closed once nothing refers to it (as gloo's context)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __del__(self) -> None:
        self.sock.close()


class KeptWork:
    """A work the script keeps after its group was dropped (the last ``isend`` of a loop): its inner work
    holds the group's connection until the interposer lets go of it."""

    __slots__ = ("_w",)

    def __init__(self, inner: Any) -> None:
        self._w = inner


kept: list[KeptWork] = []


class Group(rankside.TidalGroupBase):
    """A group whose inner part is a listening TCP socket. ``close``: how dropping it closes the socket:
    "now", "later" (another thread, once ``release`` is set: as a library closing asynchronously), "kept" (a
    work the script keeps holds it) or "never"."""

    def __init__(self, close: str) -> None:
        self.close = close
        self.release = threading.Event()
        self.builds = 0
        self._inner: Any = None
        self._opened: set[str] = set()
        self._build_inner()

    def _build_inner(self) -> None:
        before = rankside._sockets()
        self._inner = socket.create_server(("127.0.0.1", 0))
        self._opened = rankside._sockets() - before
        self.builds += 1

    def _drop_inner(self) -> None:
        inner, self._inner = self._inner, None
        if self.close == "now":
            inner.close()
        elif self.close == "later":
            def close() -> None:
                self.release.wait(10)
                inner.close()

            threading.Thread(target=close, daemon=True).start()
        elif self.close == "kept":
            kept.append(KeptWork(Conn(inner)))
        else:
            leaked.append(inner)


leaked: list[socket.socket] = []


@pytest.fixture
def rank() -> Iterator[tuple[rankside.Interposer, RankChannel]]:
    """An interposer serving requests on one pair of pipes, and its owner's channel on the other ends."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    ip = rankside.Interposer(req_r, rep_w, None, "test")
    channel = RankChannel("job.r0", rep_r, req_w)
    serving = threading.Thread(target=ip.serve, daemon=True)
    serving.start()
    ip.write(b'{"op": "hello", "pid": %d}\n' % os.getpid())
    assert channel.hello.wait(10)
    yield ip, channel
    channel.close()  # the interposer reads the end of its requests and returns
    serving.join(10)
    os.close(req_r)
    os.close(rep_w)  # the owner's pump sees the end of the replies and closes its end
    for s in leaked:
        s.close()
    leaked.clear()
    kept.clear()


def test_the_groups_sockets_are_closed_when_the_rank_says_down(rank: tuple[rankside.Interposer, RankChannel]) -> None:
    ip, channel = rank
    now, later = Group("now"), Group("later")
    ip.groups += [now, later]
    opened = now._opened | later._opened
    assert len(opened) == 2 and opened <= rankside._sockets()
    threading.Timer(0.2, later.release.set).start()  # the slow one closes its socket a moment after the drop
    cut([channel], new_epoch(), 10)
    assert not opened & rankside._sockets()
    assert now.builds == later.builds == 1  # not rebuilt: the job is being checkpointed


@pytest.fixture
def kept_group(rank: tuple[rankside.Interposer, RankChannel], monkeypatch: pytest.MonkeyPatch) -> Group:
    """A group of the rank's whose inner part, once dropped, a work the script keeps still holds."""
    monkeypatch.setattr(rankside, "_WORK_TYPES", [KeptWork])
    group = Group("kept")
    rank[0].groups.append(group)
    return group


def test_a_work_the_script_keeps_lets_go_of_its_group_at_the_teardown(
        rank: tuple[rankside.Interposer, RankChannel], kept_group: Group) -> None:
    _, channel = rank
    cut([channel], new_epoch(), 10)
    assert not kept_group._opened & rankside._sockets()
    assert [w._w for w in kept] == [None]


def test_a_rebuild_without_a_dump_lets_go_of_the_old_groups_kept_by_works(
        rank: tuple[rankside.Interposer, RankChannel], kept_group: Group) -> None:
    # A rank of a cut over several nodes goes on while the others are dumped, rebuilding its groups on a new
    # store: the next teardown looks only at the sockets of the new build, so the old ones must be gone.
    _, channel = rank
    old = kept_group._opened
    resume([channel], new_epoch(), None, rebuild=True)
    assert kept_group.builds == 2 and kept_group._opened != old
    assert not old & rankside._sockets()
    assert [w._w for w in kept] == [None]


def test_a_socket_left_open_fails_the_cut_by_name_and_the_rank_goes_on(
        rank: tuple[rankside.Interposer, RankChannel], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rankside, "TEARDOWN_WAIT_S", 0.2)
    ip, channel = rank
    group = Group("never")
    ip.groups.append(group)
    ((sock,),) = [group._opened]
    fd = next(f for f in os.listdir("/proc/self/fd") if os.readlink(f"/proc/self/fd/{f}") == sock)
    epoch = new_epoch()
    with pytest.raises(CheckpointError) as err:
        cut([channel], epoch, 10)
    port = leaked[0].getsockname()[1]
    assert err.value.message == ("sockets opened while the job's process groups were built are still open after "
                                 f"their teardown, and CRIU cannot checkpoint them: rank job.r0: fd {fd} AF_INET "
                                 f"SOCK_STREAM ('127.0.0.1', {port})")
    assert err.value.hint == "the job goes on; its last good checkpoint is untouched"
    # The rank was let go: it rebuilt its group and opened its gate.
    channel.expect(("resumed",), epoch, time.monotonic() + 10, "resume")
    assert group.builds == 2 and not ip.pending
