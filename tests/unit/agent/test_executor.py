"""The agent's executor without processes: every kind of order has exactly one handler, which takes the
typed order and gives the typed result; an action the agent cannot read (another protocol version, an
unknown kind, a bad field) is not run and is reported failed with the reason; reports are protocol messages,
and a result the control plane cannot take is reported as the action's failure instead."""

from __future__ import annotations

import logging
import queue
import threading
import typing
from types import SimpleNamespace
from typing import Any

import pytest

from tidal.agent.client import Refused
from tidal.agent.executor import Executor, Running, failure
from tidal.core import protocol
from tidal.errors import CheckpointCorrupt, LeaseLost, MechanismError, StorageError, StoreUnreachable
from tidal.testing import wait_until


class FakeClient:
    """Takes what the executor sends; ``refuse`` holds errors to raise instead, one per send."""

    node = "node-1"

    def __init__(self) -> None:
        self.sent: queue.Queue[tuple[str, protocol.Message]] = queue.Queue()
        self.refuse: list[Exception] = []

    def send(self, path: str, msg: protocol.Message) -> Any:
        if self.refuse:
            raise self.refuse.pop(0)
        self.sent.put((path, msg))
        return {"applied": True}

    def next(self) -> tuple[str, Any]:
        return self.sent.get(timeout=10)


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def lost() -> list[str]:
    return []


@pytest.fixture
def ex(client: FakeClient, lost: list[str]) -> Executor:
    # No node root nor store: these tests run no ranks.
    return Executor(client, SimpleNamespace(), SimpleNamespace(), "A1", lost.append)  # type: ignore[arg-type]


def order_types() -> tuple[type[protocol.Message], ...]:
    return typing.get_args(typing.get_args(protocol.Order)[0])  # type: ignore[no-any-return]


def kill(job: str = "j1", attempt: int = 1) -> dict[str, Any]:
    return protocol.encode(protocol.Kill(job_id=job, attempt=attempt))


def test_the_dispatch_table_has_one_handler_per_order_type(ex: Executor) -> None:
    types = order_types()
    assert len(types) == len(set(types)) == 9
    assert set(ex.handlers) == set(types)
    assert len({id(h.__func__) for h in ex.handlers.values()}) == len(types)  # type: ignore[attr-defined]
    for t, handler in ex.handlers.items():
        hints = typing.get_type_hints(handler)
        assert hints["order"] is t, handler
        assert hints["return"] is protocol.RESULTS[t.model_fields["kind"].default], handler
    assert not [n for n in dir(ex) if n.startswith("_do_")]


def test_a_readable_action_runs_its_handler_and_reports_the_typed_result(ex: Executor, client: FakeClient) -> None:
    ex.submit({"v": 1, "id": "a-1", "order": kill()})
    path, res = client.next()
    assert path == "/v1/agent/node-1/results" and isinstance(res, protocol.ActionResult)
    assert (res.agent_id, res.action_id, res.ok, res.error) == ("A1", "a-1", True, None)
    assert protocol.result_of("kill", True, res.data) == protocol.Killed(ranks=[])
    # Seen before: not run again, the same result is sent again.
    ex.submit({"v": 1, "id": "a-1", "order": kill()})
    assert client.next() == ("/v1/agent/node-1/results", res)


def test_a_failing_order_is_reported_with_its_error(ex: Executor, client: FakeClient) -> None:
    ex.submit({"id": "a-2", "order": protocol.encode(protocol.Park(job_id="j1", attempt=3, epoch=1, target=2))})
    _, res = client.next()
    assert not res.ok and res.data == {"corrupt": None, "unreachable": None}
    assert res.error.startswith("job j1 attempt 3 does not run on node-1 (")  # and what to do, as a hint


@pytest.mark.parametrize(("data", "reason"), [
    ({"v": 2, "id": "a-3", "order": kill()}, "this action speaks protocol version 2; this Tidal speaks version 1"),
    ({"id": "a-3", "order": {**kill(), "kind": "explode"}}, "bad action: order.kind"),
    ({"id": "a-3", "order": {**kill(), "attempt": -1}}, "bad action: order.kill.attempt"),
    ({"id": "a-3", "order": {**kill(), "signal": 9}}, "bad action: order.kill.signal"),
], ids=["version", "kind", "bound", "field"])
def test_an_action_it_cannot_read_is_not_run_and_reported_failed(ex: Executor, client: FakeClient,
                                                                data: dict[str, Any], reason: str) -> None:
    ran: list[protocol.Message] = []
    ex.handlers = dict.fromkeys(ex.handlers, lambda order: ran.append(order) or protocol.Done())
    ex.submit(data)
    path, res = client.next()
    assert path == "/v1/agent/node-1/results" and (res.action_id, res.ok) == ("a-3", False)
    assert res.error.startswith(f"the agent on node-1 did not run it: {reason}"), res.error
    assert protocol.result_of("kill", False, res.data) == protocol.Failure()
    ex.submit(data)  # again: the same answer, still not run
    assert client.next() == ("/v1/agent/node-1/results", res)
    assert ran == []


def test_an_action_whose_id_cannot_be_read_is_only_logged(ex: Executor, client: FakeClient,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "tidal.agent.executor"):
        for data in ({"v": 2, "order": kill()}, {"v": 2, "id": "../x"}, ["not", "an", "action"], None):
            ex.submit(data)
    assert sum("an action with no readable id was not run" in r.message for r in caplog.records) == 4
    ex.submit({"v": 2, "id": "a-4"})
    assert client.next()[1].action_id == "a-4"  # the first thing sent
    assert client.sent.empty()


def test_failure_carries_what_a_damaged_checkpoint_is() -> None:
    exc = CheckpointCorrupt("chunk ab12 of fs/out.txt is corrupt", checkpoint="000003-ab", object="fs/out.txt",
                            chunk="ab12", reason="sha256 mismatch")
    assert failure(exc) == protocol.Failure(corrupt=protocol.Corruption(
        checkpoint="000003-ab", object="fs/out.txt", chunk="ab12", reason="sha256 mismatch",
        message="chunk ab12 of fs/out.txt is corrupt"))
    # A part the protocol cannot name still says, in its message, what is damaged.
    odd = CheckpointCorrupt("manifest damaged", checkpoint="a/b" * 40)
    assert failure(odd) == protocol.Failure(corrupt=protocol.Corruption(message="manifest damaged"))
    assert failure(MechanismError("criu dump failed")) == protocol.Failure()


def test_failure_carries_the_store_that_could_not_be_reached() -> None:
    exc = StoreUnreachable("the checkpoint store s3://ck-west/t cannot be reached: connection refused",
                           store="s3://ck-west/t", reason="unavailable")
    assert failure(exc) == protocol.Failure(unreachable=protocol.Unreachable(
        store="s3://ck-west/t", message="the checkpoint store s3://ck-west/t cannot be reached: connection refused"))
    # Any other failure of a store is not that: the control plane retries it as it did.
    assert failure(StorageError("checkpoint store refused reading x: access denied", reason="access denied")) == \
        protocol.Failure()


def test_exits_are_reported_and_a_later_kill_of_that_attempt_says_how_they_ended(ex: Executor,
                                                                                 client: FakeClient) -> None:
    ranks = [protocol.RankExit(rank=0, code=0, at=1.0), protocol.RankExit(rank=1, signal=9, at=2.0)]
    ex._report_exit(Running("j1", 4, SimpleNamespace(), []), ranks)  # type: ignore[arg-type]
    path, report = client.next()
    assert path == "/v1/agent/node-1/exits"
    assert report == protocol.ExitReport(agent_id="A1", job_id="j1", attempt=4, ranks=ranks)
    ex.submit({"id": "a-5", "order": kill(attempt=4)})
    assert protocol.result_of("kill", True, client.next()[1].data) == protocol.Killed(ranks=ranks)
    ex.submit({"id": "a-6", "order": kill(attempt=5)})
    assert protocol.result_of("kill", True, client.next()[1].data) == protocol.Killed(ranks=[])


def test_reports_go_under_the_agent_id_of_the_time(ex: Executor, client: FakeClient) -> None:
    ex.outbox.agent_id = "B2"  # the lease was lost and taken again
    ex.submit({"id": "a-7", "order": kill()})
    assert client.next()[1].agent_id == "B2"


def test_a_result_the_control_plane_cannot_take_becomes_the_actions_failure(ex: Executor,
                                                                            client: FakeClient) -> None:
    client.refuse = [Refused("the control plane refused POST /v1/agent/node-1/results: bad result of a kill "
                             "order: ranks.0.rank: too large", status=422, error="ValidationError")]
    ex.submit({"id": "a-8", "order": kill()})
    _, res = client.next()
    assert (res.action_id, res.ok, res.data) == ("a-8", False, {"corrupt": None, "unreachable": None})
    assert res.error.startswith("the control plane refused the agent's result: the control plane refused POST")
    # A refused failure is not answered with another one.
    client.refuse = [Refused("no", status=422)]
    ex.submit({"id": "a-9", "order": protocol.encode(protocol.Park(job_id="j9", attempt=1, epoch=1, target=1))})
    ex.submit({"id": "a-10", "order": kill()})
    assert client.next()[1].action_id == "a-10"


def test_a_lost_lease_on_a_report_fences_the_agent(ex: Executor, client: FakeClient, lost: list[str]) -> None:
    client.refuse = [LeaseLost("agent A1 does not hold node node-1")]
    ex.submit({"id": "a-11", "order": kill()})
    ex.submit({"id": "a-12", "order": kill()})
    assert client.next()[1].action_id == "a-12"
    assert lost == ["A1"]  # the agent id the control plane refused


@pytest.mark.parametrize(("master", "want"), [("198.18.0.10", "198.18.0.10"), (None, "127.0.0.1")])
def test_ranks_get_torchruns_variables_with_the_master_the_order_names(ex: Executor, master: str | None,
                                                                       want: str) -> None:
    order = protocol.Launch(job_id="j1", attempt=1, argv=["python", "train.py"], workdir="/w", env={"A": "1"},
                            world_size=4, local_world_size=2, master_addr=master,
                            ranks=[protocol.RankSlot(rank=2, local_rank=0, device=0),
                                   protocol.RankSlot(rank=3, local_rank=1, device=1)])
    specs = ex._specs(order)
    assert [(s.rank, s.env["RANK"], s.env["LOCAL_RANK"]) for s in specs] == [(2, "2", "0"), (3, "3", "1")]
    for s in specs:
        assert s.env["MASTER_ADDR"] == want and s.env["WORLD_SIZE"] == "4" and s.env["LOCAL_WORLD_SIZE"] == "2"
        assert s.env["A"] == "1"


# -- fencing: actions belong to the lease they came under ---------------------------------------------------
def test_after_a_fence_no_action_runs_until_a_new_lease_is_held(ex: Executor, client: FakeClient,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    ex.handlers[protocol.Kill] = lambda order: ran.append(order.job_id) or protocol.Killed(ranks=[])
    ex.fence()
    with caplog.at_level(logging.INFO, "tidal.agent.executor"):
        ex.submit({"id": "a-20", "order": kill("j-now")})  # no lease is held now
        ex.submit({"id": "a-21", "order": kill("j-old")}, "A1")  # fetched before the fence, taken after it
    assert sum("it came under a lease this agent no longer holds" in r.message for r in caplog.records) == 2
    ex.hold("B2")
    ex.submit({"id": "a-22", "order": kill("j-old")}, "A1")  # still A1's: dropped
    ex.submit({"id": "a-23", "order": kill("j-new")}, "B2")
    _, res = client.next()
    assert (res.action_id, res.agent_id, res.ok) == ("a-23", "B2", True)
    assert ran == ["j-new"]
    assert (ex.agent_id, ex.outbox.agent_id, ex.lease) == ("B2", "B2", "B2")


def test_an_action_queued_when_the_fence_comes_is_not_run(ex: Executor, client: FakeClient) -> None:
    ran: list[str] = []
    entered, go_on = threading.Event(), threading.Event()

    def slow(order: protocol.Kill) -> protocol.Killed:
        ran.append(str(order.attempt))
        entered.set()
        go_on.wait(10)
        return protocol.Killed(ranks=[])

    ex.handlers[protocol.Kill] = slow
    ex.submit({"id": "a-30", "order": kill(attempt=1)})
    assert entered.wait(10)
    ex.submit({"id": "a-31", "order": kill(attempt=2)})  # queued behind a-30 (the same job's)
    ex.fence()
    go_on.set()
    wait_until(lambda: "j1" not in ex.queues, timeout=10, what="j1's queue to drain")
    assert ran == ["1"]
    assert "a-31" not in ex.inflight and "a-31" not in ex.results  # sent again under a new lease, it would run


def test_ranks_started_as_the_fence_comes_are_killed_at_once(ex: Executor, client: FakeClient) -> None:
    killed: list[str] = []

    def make(placement: object) -> Any:
        ex.fence()  # while the launch (or a restore) was starting the ranks
        return SimpleNamespace(kill=lambda: killed.append("j1"), ranks=[])

    order = protocol.Launch(job_id="j1", attempt=1, argv=["sleep", "60"], workdir="/w", env={}, world_size=1,
                            local_world_size=1, ranks=[protocol.RankSlot(rank=0, local_rank=0, device=0)])
    ex.handlers[protocol.Launch] = lambda o: ex._start(o, make)
    ex.submit({"id": "a-40", "order": protocol.encode(order)})
    _, res = client.next()
    assert (res.action_id, res.ok) == ("a-40", False)
    assert "were killed as they started: the agent fenced them meanwhile" in res.error
    assert killed == ["j1"] and ex.jobs == {}


def test_a_fence_kills_every_rank_before_waiting_for_any(ex: Executor) -> None:
    events: list[str] = []

    def rank(name: str) -> SimpleNamespace:
        return SimpleNamespace(kill=lambda wait=True: events.append(f"kill {name}" + ("" if wait else " now")))

    for job in ("j1", "j2"):
        ranks = [rank(f"{job}/0"), rank(f"{job}/1")]
        job_ = SimpleNamespace(ranks=ranks, kill=lambda ranks=ranks: [r.kill(wait=True) for r in ranks])
        ex.jobs[job] = Running(job, 1, job_, [])  # type: ignore[arg-type]
    ex.fence()
    assert events[:4] == ["kill j1/0 now", "kill j1/1 now", "kill j2/0 now", "kill j2/1 now"]
    assert events[4:] == ["kill j1/0", "kill j1/1", "kill j2/0", "kill j2/1"]
    assert ex.jobs == {} and ex.lease is None


def test_only_the_newest_results_are_kept(ex: Executor, client: FakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tidal.agent.executor.RESULTS_KEPT", 3)
    for i in range(5):
        ex.submit({"v": 1, "id": f"k-{i}", "order": kill()})
        client.next()
    assert list(ex.results) == ["k-2", "k-3", "k-4"]  # bounded, oldest forgotten first
    ex.submit({"v": 1, "id": "k-4", "order": kill()})  # a recent one delivered again: its result, not run
    assert client.next()[1].action_id == "k-4" and list(ex.results) == ["k-2", "k-3", "k-4"]


class _Rounds:
    """A job whose park rounds block until a newer round supersedes them (as the ranks' would when they
    wait for ranks on another node that need more)."""

    def __init__(self) -> None:
        self.newest = (-1, -1)
        self.changed = threading.Condition()

    def supersede(self, epoch: int, version: int) -> None:
        with self.changed:
            self.newest = max(self.newest, (epoch, version))
            self.changed.notify_all()

    def park(self, epoch: int, plan: Any) -> list[Any]:
        with self.changed:
            if not self.changed.wait_for(lambda: self.newest > (epoch, plan.version) or plan.version == 1,
                                         timeout=10):
                raise AssertionError(f"round {plan.version} was never superseded")
        return []


def test_a_newer_park_round_ends_the_running_one_at_once(ex: Executor, client: FakeClient) -> None:
    rounds = _Rounds()
    ex.jobs["j1"] = Running("j1", 1, rounds, [])  # type: ignore[arg-type]

    def park(version: int) -> dict[str, Any]:
        return protocol.encode(protocol.Park(job_id="j1", attempt=1, epoch=5, targets={"0": 3},
                                             members={"0": [0, 1]}, version=version))

    ex.submit({"id": "a-20", "order": park(0)})
    ex.submit({"id": "a-21", "order": park(1)})  # queued behind the first, which it supersedes
    answered = [client.next()[1] for _ in range(2)]
    assert [(r.action_id, r.ok) for r in answered] == [("a-20", True), ("a-21", True)]
    assert rounds.newest == (5, 1)
    assert protocol.result_of("park", True, answered[1].data) == protocol.Parked(version=1)
