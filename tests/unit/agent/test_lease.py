"""The agent's lease deadline, on a clock moved by hand: it fences at the deadline (the send time of the
last acknowledged heartbeat, plus the lease, less the margin) and not before; each lease ends once, however
many of the agent's threads find it gone; and the agent's paths to a fence (the watchdog, a LeaseLost
answer) fence and register again once between them."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tidal.agent.client import Refused, Unreachable
from tidal.agent.lease import MIN_MARGIN_S, LeaseClock, fence_margin, request_timeout
from tidal.agent.main import Agent
from tidal.core import protocol
from tidal.errors import LeaseLost, ValidationError
from tidal.testing import FakeClock

LEASE = 4.0  # margin 1 s: the agent fences 3 s after sending its last acknowledged heartbeat


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=100.0)


@pytest.fixture
def lease(clock: FakeClock) -> LeaseClock:
    lc = LeaseClock(clock.monotonic)
    lc.held("A1", lc.attempt(), LEASE)
    return lc


def test_the_margin_is_half_a_second_or_a_quarter_of_the_lease() -> None:
    assert fence_margin(1.0) == MIN_MARGIN_S == 0.5
    assert fence_margin(2.0) == 0.5
    assert fence_margin(3.0) == 0.75
    assert fence_margin(10.0) == 2.5


@pytest.mark.parametrize("lease_s", [2.0, 3.0, 5.0, 10.0, 60.0])
def test_two_heartbeats_fit_before_the_deadline_even_if_the_first_hangs(lease_s: float) -> None:
    # Acknowledged at 0; the next is sent a fifth of the lease later and hangs until its timeout; the one
    # after it (a twentieth later) still has its whole timeout before the agent must fence.
    second = lease_s / 5 + request_timeout(lease_s) + lease_s / 20
    assert second + request_timeout(lease_s) <= lease_s - fence_margin(lease_s) + 1e-9


def test_no_deadline_before_the_first_registration(clock: FakeClock) -> None:
    lc = LeaseClock(clock.monotonic)
    assert lc.holder is None and lc.deadline() is None and lc.remaining() is None
    clock.advance(1000)
    assert lc.expire() is None


def test_it_fences_at_the_deadline_not_before(lease: LeaseClock, clock: FakeClock) -> None:
    assert lease.holder == "A1" and lease.deadline() == 103.0 and lease.remaining() == 3.0
    clock.advance(2.75)
    assert lease.expire() is None and lease.holder == "A1"
    clock.advance(0.25)
    assert lease.remaining() == 0.0
    assert lease.expire() == "A1"
    assert lease.holder is None and lease.deadline() is None


def test_an_acknowledged_heartbeat_pushes_the_deadline(lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(2.0)
    assert lease.renewed("A1", lease.attempt(), LEASE)
    assert lease.deadline() == 105.0
    clock.advance(2.9)  # past the first deadline, before the new one
    assert lease.expire() is None
    clock.advance(0.1)
    assert lease.expire() == "A1"


def test_a_heartbeat_that_was_never_acknowledged_counts_for_nothing(lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(1.0)
    lease.attempt()  # sent; no answer came (timed out, or the link is down)
    clock.advance(2.0)
    assert lease.expire() == "A1"


def test_a_heartbeat_acknowledged_late_counts_from_when_it_was_sent(lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(1.0)
    sent = lease.attempt()
    clock.advance(1.5)  # the answer takes 1.5 s
    assert lease.renewed("A1", sent, LEASE)
    assert lease.deadline() == 104.0  # 101 + 4 - 1, not 102.5 + 4 - 1
    assert lease.since_acknowledged() == 1.5
    clock.advance(1.5)
    assert lease.expire() == "A1"


def test_an_older_heartbeat_acknowledged_after_a_newer_one_does_not_pull_the_deadline_back(
        lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(1.0)
    older = lease.attempt()
    clock.advance(1.0)
    newer = lease.attempt()
    assert lease.renewed("A1", newer, LEASE)
    assert not lease.renewed("A1", older, LEASE)
    assert lease.deadline() == 105.0


def test_a_shorter_lease_in_an_answer_brings_the_deadline_closer(lease: LeaseClock, clock: FakeClock) -> None:
    # The control plane restarted with a shorter --lease: its leases now run out sooner.
    assert lease.renewed("A1", lease.attempt(), 2.0)
    assert lease.deadline() == 101.5
    clock.advance(1.5)
    assert lease.expire() == "A1"


def test_a_lease_ends_once(lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(3.0)
    assert lease.expire() == "A1"
    assert lease.expire() is None
    assert not lease.lose("A1")  # a LeaseLost answer arriving now: already fenced
    # A heartbeat sent before the fence and acknowledged after it renews nothing: the ranks are gone.
    assert not lease.renewed("A1", lease.attempt(), LEASE)
    assert lease.deadline() is None


def test_lost_then_deadline_fences_once(lease: LeaseClock, clock: FakeClock) -> None:
    assert lease.lose("A1")
    assert not lease.lose("A1")
    clock.advance(10.0)
    assert lease.expire() is None


def test_of_threads_finding_the_lease_gone_at_once_one_alone_fences(lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(3.0)
    start = threading.Barrier(16)
    wins: list[str] = []

    def expire() -> None:
        start.wait()
        if (who := lease.expire()) is not None:
            wins.append(who)

    def lose() -> None:
        start.wait()
        if lease.lose("A1"):
            wins.append("A1")

    threads = [threading.Thread(target=expire if i % 2 else lose) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert wins == ["A1"]


def test_registering_again_holds_a_new_lease_that_answers_about_the_old_one_leave_alone(
        lease: LeaseClock, clock: FakeClock) -> None:
    clock.advance(1.0)
    old_beat = lease.attempt()
    clock.advance(2.0)
    assert lease.expire() == "A1"
    clock.advance(5.0)  # trying to reach the control plane
    sent = lease.attempt()
    clock.advance(0.5)
    lease.held("B2", sent, LEASE)
    assert lease.holder == "B2" and lease.deadline() == 108.0 + 3.0
    # Late answers to requests made as A1 neither renew nor end B2's lease.
    assert not lease.renewed("A1", old_beat, LEASE)
    assert not lease.lose("A1")
    assert lease.holder == "B2"
    assert lease.renewed("B2", lease.attempt(), LEASE)
    clock.advance(3.0)
    assert lease.expire() == "B2"


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_lease_must_last(lease: LeaseClock, bad: float) -> None:
    with pytest.raises(ValidationError, match="lease_s"):
        lease.held("A1", lease.attempt(), bad)
    with pytest.raises(ValidationError, match="lease_s"):
        lease.renewed("A1", lease.attempt(), bad)


# -- the agent's two paths to a fence --------------------------------------------------------------------
class FakeExecutor:
    def __init__(self) -> None:
        self.fences = 0
        self.agent_id = "A1"
        self.outbox = SimpleNamespace(agent_id="A1")
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def fence(self) -> None:
        self.fences += 1
        self.entered.set()
        self.go_on.wait(10)  # killing ranks takes a while: the other paths find the lease gone meanwhile


class FakeClient:
    """Answers the agent's requests with ``answers`` in turn (an exception is raised), then with {}."""

    def __init__(self, *answers: Exception) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, protocol.Message]] = []

    def send(self, path: str, msg: protocol.Message, **kw: Any) -> Any:
        assert not kw.get("retry", True) and 0 < kw["timeout"] <= 10  # one try at a time, bounded
        self.sent.append((path, msg))
        if self.answers:
            raise self.answers.pop(0)
        return {}


def agent(clock: FakeClock, executor: FakeExecutor, client: FakeClient | None = None) -> tuple[Agent, list[str]]:
    """An agent with only what fencing and registering again touch: no process, no control plane."""
    a = object.__new__(Agent)
    a.client = client or FakeClient()  # type: ignore[assignment]
    a.name, a.agent_id = "node-1", "A1"
    a.lease = LeaseClock(clock.monotonic)
    a.lease.held("A1", a.lease.attempt(), LEASE)
    a.registered = threading.Event()
    a.registered.set()
    a._executor = executor  # type: ignore[assignment]
    registered: list[str] = []

    def register() -> None:
        registered.append(a.agent_id)
        a.lease.held(a.agent_id, a.lease.attempt(), LEASE)
        a.registered.set()

    a.register = register  # type: ignore[method-assign]
    return a, registered


def test_the_watchdog_and_lease_lost_answers_fence_and_register_again_once(clock: FakeClock) -> None:
    ex = FakeExecutor()
    a, registered = agent(clock, ex)
    clock.advance(3.0)
    lost = a.lease.expire()
    assert lost == "A1"
    watchdog = threading.Thread(target=a.expired, args=(lost,))
    watchdog.start()
    assert ex.entered.wait(10)
    assert not a.registered.is_set()  # the other threads wait for the next registration
    # Meanwhile the heartbeat, poll and log threads get LeaseLost for A1.
    others = [threading.Thread(target=a.lease_lost, args=("A1",)) for _ in range(3)]
    for t in others:
        t.start()
    for t in others:
        t.join(10)
    ex.go_on.set()
    watchdog.join(10)
    assert ex.fences == 1
    assert len(registered) == 1 and registered[0] != "A1" == lost
    assert a.lease.holder == a.agent_id == ex.agent_id == ex.outbox.agent_id == registered[0]
    assert a.registered.is_set()
    a.lease_lost("A1")  # a late answer to a request made as A1: the new lease stays
    assert ex.fences == 1 and a.lease.holder == registered[0]
    # A1's lease was given back before registering again: the control plane need not wait for it to run out.
    assert a.client.sent == [("/v1/agent/node-1/leave", protocol.Leave(agent_id="A1"))]  # type: ignore[attr-defined]


def test_a_lease_lost_answer_fences_and_registers_again(clock: FakeClock) -> None:
    ex = FakeExecutor()
    ex.go_on.set()
    a, registered = agent(clock, ex)
    a.lease_lost("A1")
    assert ex.fences == 1 and len(registered) == 1 and a.lease.holder == registered[0] != "A1"
    assert a.client.sent == []  # type: ignore[attr-defined]  # the control plane said it holds nothing
    clock.advance(10.0)  # the old deadline means nothing now: the new lease runs from its registration
    assert a.lease.expire() == registered[0]


@pytest.mark.parametrize("end", [LeaseLost("agent A1 does not hold node node-1"),
                                 Refused("no node node-1", status=404)], ids=["expired", "forgotten"])
def test_after_its_own_fence_the_agent_gives_the_lease_back_once_the_control_plane_answers(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch, end: Exception) -> None:
    monkeypatch.setattr("tidal.agent.main.time.sleep", lambda s: None)
    ex = FakeExecutor()
    ex.go_on.set()
    client = FakeClient(Unreachable("the control plane at ... is unreachable"), Refused("busy", status=503), end)
    a, registered = agent(clock, ex, client)
    clock.advance(3.0)
    a.expired(a.lease.expire() or "")
    # Tried until answered; an answer that there is nothing to give back (it expired the lease already, or
    # forgot the node) ends it too. Then the agent registers again.
    assert client.sent == [("/v1/agent/node-1/leave", protocol.Leave(agent_id="A1"))] * 3
    assert ex.fences == 1 and len(registered) == 1
