"""The protocol between the control plane and its agents: every message survives the trip through JSON
unchanged, and what does not fit the protocol is refused naming why — an unknown field, an order of an
unknown kind, another protocol version (a ProtocolMismatch naming both), a value over its bound."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest

from tidal.core import limits, protocol
from tidal.errors import ProtocolMismatch, ValidationError

RDV = protocol.Rendezvous(addr="127.0.0.1:29500", prefix="j1/2/c")
SLOTS = [protocol.RankSlot(rank=0, local_rank=0, device=0, cpus=[0, 1]), protocol.RankSlot(rank=1, local_rank=1,
                                                                                          device=1)]
START: dict[str, Any] = {"job_id": "j1", "attempt": 2, "argv": ["python", "train.py", "--lr", "0.1"],
                         "workdir": "/work", "env": {"PATH": "/bin", "EMPTY": ""}, "world_size": 4,
                         "local_world_size": 2, "unix_user": "alice", "ranks": SLOTS, "rendezvous": RDV, "fs": False}
ORDERS: list[protocol.Message] = [
    protocol.Launch(**START),
    protocol.Restore(**START, checkpoint=protocol.CheckpointRef(id="000003-ab", parts=["000003-ab.p0"])),
    protocol.CutCounts(job_id="j1", attempt=2, epoch=2**47),
    protocol.Park(job_id="j1", attempt=2, epoch=7, target=120),
    protocol.Park(job_id="j1", attempt=2, epoch=7, target=120, targets={"0": 120, "1": 40, "0:1>2:7": 3},
                  members={"0": [0, 1, 2, 3], "1": [0, 2], "0:1>2:7": [1, 2]}, version=2),
    protocol.Checkpoint(job_id="j1", attempt=2, then="hold", checkpoint_id="000004-cd.p1", keep_ids=["000003-ab"],
                        rendezvous=RDV, fs=False, cut=protocol.Cut(epoch=7, target=120)),
    protocol.Checkpoint(job_id="j1", attempt=2, then="continue", checkpoint_id="000004-cd.p0", keep_ids=[],
                        cut=protocol.Cut(epoch=7, target=120, targets={"0": 120, "1": 41}, version=3)),
    protocol.Checkpoint(job_id="j1", attempt=2, then="kill", checkpoint_id="000005-ef", keep_ids=["000004-cd"],
                        restore_here=True, commit_after=True, warm=True),
    protocol.Finish(job_id="j1", attempt=2, then="resume", rebuild=True, rendezvous=RDV),
    protocol.Kill(job_id="j1", attempt=2, report=True),
    protocol.Prestage(job_id="j1", attempt=2, checkpoint=protocol.CheckpointRef(id="000003-ab", parts=["000003-ab"]),
                      ranks=[1, 3]),
    protocol.Unstage(job_id="j1", attempt=2),
]
EXIT = protocol.RankExit(rank=1, code=None, signal=9, at=1700000000.5, stopped=True)
RESULTS: list[protocol.Message] = [
    protocol.Started(ranks=[protocol.RankPid(rank=0, pid=4242), protocol.RankPid(rank=1, pid=None)]),
    protocol.Counted(counts={"0": 12, "1": 13}),
    protocol.Counted(counts={"0": 12, "1": 13}, default="0", comms={
        "0": protocol.Comm(count=13, members=[0, 1, 2, 3]), "0:1>2:0": protocol.Comm(count=4, members=[1, 2])}),
    protocol.Parked(),
    protocol.Parked(version=2, needs=[protocol.Need(key="1", members=[0, 2], count=41)]),
    protocol.Done(),
    protocol.Dumped(checkpoint=protocol.StoredCheckpoint(id="000004-cd", created_at=1.5, bytes=10, stored_bytes=3)),
    protocol.Dumped(checkpoint=protocol.StoredCheckpoint(id="000005-ef", created_at=2.5, bytes=10, stored_bytes=0),
                    committing=True),
    protocol.Killed(ranks=[EXIT, protocol.RankExit(rank=0, code=0)]),
    protocol.Prestaged(checkpoint="000003-ab", ranks=[1, 3], bytes=1 << 30, seconds=7.5),
    protocol.Prestaged(checkpoint="000003-ab", ranks=[0], bytes=1 << 30, seconds=7.5, replicated_bytes=1 << 29,
                       replicated_chunks=128, replicated_s=6.25),
    protocol.Failure(unreachable=protocol.Unreachable(store="s3://ck-west/t", message="connection refused")),
    protocol.Failure(corrupt=protocol.Corruption(checkpoint="000003-ab", object="fs/out.txt", chunk="ab12",
                                                 reason="sha256 mismatch", message="chunk ab12 is corrupt")),
    protocol.Failure(corrupt=protocol.Corruption(message="the manifest is damaged")),
    protocol.Failure(),
]
FROM_AGENT: list[protocol.Message] = [
    protocol.Register(agent_id="A1", name="node-1", region="eu", cluster="c1", devices=2, cpus=[[0, 1], [2, 3]]),
    protocol.Register(agent_id="A1", name="gpu-1", devices=2, cpus=[[0], [1]], gpus=[
        protocol.GpuDevice(index=0, uuid="GPU-0f4c2c1e-6a1b-4d2e-9b7a-2f3c4d5e6f70", model="NVIDIA H100 80GB HBM3",
                           memory_bytes=85520809984),
        protocol.GpuDevice(index=1, uuid="GPU-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", model="NVIDIA H100 80GB HBM3",
                           memory_bytes=85520809984)]),
    protocol.Leave(agent_id="A1"),
    protocol.Heartbeat(agent_id="A1", jobs={"j1": {"attempt": 2, "cpu_s": 1.5, "steps_per_s": 3.25}}),
    protocol.ActionResult(agent_id="A1", action_id="a-9", ok=True, data=protocol.encode(RESULTS[0])),
    protocol.ActionResult(agent_id="A1", action_id="a-9", ok=False, error="it broke", data={}),
    protocol.ExitReport(agent_id="A1", job_id="j1", attempt=2, ranks=[EXIT]),
    protocol.CommitReport(agent_id="A1", job_id="j1", attempt=3, checkpoint_id="000005-ef", ok=True, bytes=10,
                          stored_bytes=4),
    protocol.CommitReport(agent_id="A1", job_id="j1", attempt=3, checkpoint_id="000005-ef", ok=False,
                          error="the store refused it: disk full"),
]
MESSAGES = [protocol.Action(id=f"a-{i}", order=o) for i, o in enumerate(ORDERS)] + RESULTS + FROM_AGENT


def order_types() -> tuple[type[protocol.Message], ...]:
    union = typing.get_args(protocol.Order)[0]
    return typing.get_args(union)  # type: ignore[no-any-return]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_round_trip_through_json(msg: protocol.Message) -> None:
    wire = json.loads(json.dumps(protocol.encode(msg)))
    assert protocol.decode(type(msg), wire) == msg
    if isinstance(msg, protocol.Action):
        assert protocol.decode_action(wire) == msg
        assert wire["v"] == protocol.VERSION and wire["order"]["kind"] == msg.kind
        assert protocol.decode_order(wire["order"]) == msg.order


def test_the_samples_cover_every_order_and_result() -> None:
    assert {type(o) for o in ORDERS} == set(order_types())
    assert {type(r) for r in RESULTS} == set(protocol.RESULTS.values()) | {protocol.Failure}
    # Every kind of order has its result model, and the kinds are the orders' own.
    kinds = {t.model_fields["kind"].default for t in order_types()}
    assert kinds == set(protocol.RESULTS) == set(typing.get_args(protocol.OrderKind))


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.kind)  # type: ignore[attr-defined]
def test_result_of_reads_each_kind_of_order_as_its_result(order: protocol.Launch) -> None:
    model = protocol.RESULTS[order.kind]
    sample = next(r for r in RESULTS if type(r) is model)
    assert protocol.result_of(order.kind, True, protocol.encode(sample)) == sample
    failure = protocol.encode(RESULTS[-2])
    assert protocol.result_of(order.kind, False, failure) == RESULTS[-2]
    with pytest.raises(ValidationError):
        protocol.result_of(order.kind, False, {"counts": {}})  # a failure carries no result


def test_a_result_that_is_not_its_orders_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        protocol.result_of("checkpoint", True, {"checkpoint": {"id": "c1", "created_at": 1.0, "bytes": -1,
                                                               "stored_bytes": 0}})
    assert e.value.fields["field"] == "checkpoint.bytes"
    with pytest.raises(ValidationError) as e:
        protocol.result_of("launch", True, {"ranks": [], "kept": []})
    assert e.value.fields["field"] == "kept"
    with pytest.raises(ValidationError) as e:
        protocol.result_of("explode", True, {})
    assert e.value.fields["field"] == "kind" and "explode" in e.value.message


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_an_unknown_field_is_refused_naming_it(msg: protocol.Message) -> None:
    with pytest.raises(ValidationError) as e:
        protocol.decode(type(msg), {**protocol.encode(msg), "colour": "blue"})
    assert e.value.fields["field"] == "colour"
    assert "colour" in e.value.message and not isinstance(e.value, ProtocolMismatch)


def test_a_commit_reports_error_is_bounded() -> None:
    with pytest.raises(ValidationError, match="error"):
        protocol.decode(protocol.CommitReport, {"agent_id": "A", "job_id": "j1", "attempt": 1,
                                                "checkpoint_id": "000001-ab", "ok": False, "error": "x" * 4001})


def test_an_unknown_field_that_is_not_valid_unicode_is_named_escaped() -> None:
    with pytest.raises(ValidationError) as e:
        protocol.decode(protocol.ExitReport, {"agent_id": "A", "job_id": "j1", "attempt": 1, "ranks": [],
                                              "x\ud800": None})
    assert e.value.fields["field"] == "x\\ud800"
    with pytest.raises(ValidationError) as e:
        protocol.decode(protocol.ExitReport, {"agent_id": "A", "job_id": "j1", "attempt": 1,
                                              "ranks": [{"rank": 0, "\udfff": 1}]})
    assert e.value.fields["field"] == "ranks.0.\\udfff"


def test_an_unknown_field_inside_an_order_is_refused_naming_it() -> None:
    wire = protocol.encode(protocol.Action(id="a-1", order=ORDERS[0]))
    wire["order"]["argvv"] = ["x"]
    with pytest.raises(ValidationError) as e:
        protocol.decode_action(wire)
    assert e.value.fields["field"] == "order.launch.argvv"


def test_an_order_of_an_unknown_kind_is_refused() -> None:
    for kind in ("explode", None, 3):
        with pytest.raises(ValidationError) as e:
            protocol.decode_action({"id": "a-1", "order": {"kind": kind, "job_id": "j1", "attempt": 1}})
        assert e.value.fields["field"] == "order.kind", kind
    with pytest.raises(ValidationError) as e:
        protocol.decode_action({"id": "a-1", "order": {"job_id": "j1", "attempt": 1}})
    assert e.value.fields["field"] == "order.kind"
    with pytest.raises(ValidationError) as e:
        protocol.decode_order({"kind": "explode", "job_id": "j1", "attempt": 1})
    assert e.value.fields["field"] == "kind"


@pytest.mark.parametrize("msg", [m for m in MESSAGES if "v" in type(m).model_fields], ids=lambda m: type(m).__name__)
def test_another_protocol_version_is_a_mismatch_naming_both(msg: protocol.Message) -> None:
    for v in (2, 0, "1", True, None):
        wire = {**protocol.encode(msg), "v": v}
        with pytest.raises(ProtocolMismatch) as e:
            protocol.decode(type(msg), wire)
        assert e.value.status_code == 426
        assert f"protocol version {v!r}" in e.value.message and f"speaks version {protocol.VERSION}" in e.value.message
        assert e.value.fields == {"version": v, "accepted": [protocol.VERSION]}
        assert e.value.hint and "same Tidal release" in e.value.hint
    # Checked before anything else: a message of another version is not read any further.
    with pytest.raises(ProtocolMismatch):
        protocol.decode(type(msg), {"v": 2, "whatever": "a later version sends"})
    # A message with no version is of this one (peers older than the field spoke it).
    wire = protocol.encode(msg)
    del wire["v"]
    assert protocol.decode(type(msg), wire) == msg


def test_an_action_of_another_version_names_itself() -> None:
    with pytest.raises(ProtocolMismatch) as e:
        protocol.decode_action({"v": 2, "id": "a-1", "order": {}})
    assert e.value.message.startswith("this action speaks protocol version 2; this Tidal speaks version 1")
    with pytest.raises(ProtocolMismatch) as e:
        protocol.decode(protocol.Heartbeat, {"v": 2, "agent_id": "A"})
    assert e.value.message.startswith("this Heartbeat from an agent speaks protocol version 2")


def _launch(**kw: Any) -> dict[str, Any]:
    return {"id": "a-1", "order": {**protocol.encode(ORDERS[0]), **kw}}


def test_bounds_are_refused_naming_the_field() -> None:
    cases = {
        "order.launch.argv": _launch(argv=["x"] * (limits.MAX_COMMAND_ARGS + 1)),
        "order.launch.argv.1": _launch(argv=["python", "y" * (limits.MAX_ARG_BYTES + 1)]),
        "order.launch.ranks": _launch(ranks=[{"rank": 0, "local_rank": 0, "device": 0}] * (limits.MAX_RANKS + 1)),
        "order.launch.ranks.0.rank": _launch(ranks=[{"rank": limits.MAX_RANKS, "local_rank": 0, "device": 0}]),
        "order.launch.world_size": _launch(world_size=limits.MAX_RANKS + 1),
        "order.launch.env": _launch(env={f"V{i}": "" for i in range(limits.MAX_ENV_VARS + 1)}),
        "order.launch.job_id": _launch(job_id="../etc"),
        "id": {**_launch(), "id": "a" * (limits.MAX_ID_CHARS + 1)},
    }
    for field, wire in cases.items():
        with pytest.raises(ValidationError) as e:
            protocol.decode_action(wire)
        assert e.value.fields["field"] == field, (field, e.value)
    with pytest.raises(ValidationError) as e:
        protocol.decode(protocol.ExitReport, {"agent_id": "A", "job_id": "j1", "attempt": 1,
                                              "ranks": [{"rank": 0}] * (limits.MAX_RANKS + 1)})
    assert e.value.fields["field"] == "ranks"
    with pytest.raises(ValidationError) as e:
        protocol.decode(protocol.Heartbeat, {"agent_id": "A", "jobs": {f"j{i}": {} for i in
                                                                     range(limits.MAX_HEARTBEAT_JOBS + 1)}})
    assert e.value.fields["field"] == "jobs"


def _park(**kw: Any) -> dict[str, Any]:
    return {"id": "a-1", "order": {**protocol.encode(ORDERS[3]), **kw}}


def test_the_cuts_communicators_are_bounded_naming_the_field() -> None:
    many = {f"g{i}": 1 for i in range(limits.MAX_COMMUNICATORS + 1)}
    long = "k" * (limits.MAX_COMMUNICATOR_CHARS + 1)
    # Fewer communicators than the bound, but more members than all of them together may have.
    wide = {f"g{i}": list(range(limits.MAX_RANKS))
            for i in range(limits.MAX_CUT_MEMBERS // limits.MAX_RANKS + 1)}
    cases = {
        "order.park.targets": _park(targets=many),
        f"order.park.targets.{long}.[key]": _park(targets={long: 1}),
        "order.park.targets.0": _park(targets={"0": -1}),
        "order.park.members.0.0": _park(members={"0": [limits.MAX_RANKS]}),
        "order.park.members.0": _park(members={"0": []}),
        "order.park": _park(members=wide),
    }
    for field, wire in cases.items():
        with pytest.raises(ValidationError) as e:
            protocol.decode_action(wire)
        assert e.value.fields["field"] == field, (field, e.value)
    comm = {"count": 1, "members": [0]}
    for field, data in {
        "comms": {"counts": {}, "comms": {k: comm for k in many}},
        "comms.g0.count": {"counts": {}, "comms": {"g0": {"count": 2**63, "members": [0]}}},
        "(message)": {"counts": {}, "comms": {k: {"count": 1, "members": m} for k, m in wide.items()}},
    }.items():
        with pytest.raises(ValidationError) as e:
            protocol.result_of("cut", True, data)
        assert e.value.fields["field"] == field, (field, e.value)
    with pytest.raises(ValidationError) as e:
        protocol.result_of("park", True, {"needs": [{"key": "g", "members": [0], "count": 1}] *
                                          (limits.MAX_COMMUNICATORS + 1)})
    assert e.value.fields["field"] == "needs"


def test_a_park_answer_of_an_agent_that_reports_no_needs_is_read_as_parked() -> None:
    # An agent that cuts the world group only answers a park with nothing: every rank there parked.
    assert protocol.result_of("park", True, {}) == protocol.Parked()


def test_a_registration_names_cpus_for_any_bad_cpu_set() -> None:
    for cpus in ([[0]], [[0], []], [[0], [1, 1]], [[0], [limits.MAX_CPU_ID + 1]], [[0], [-1]]):
        with pytest.raises(ValidationError) as e:
            protocol.decode(protocol.Register, {"agent_id": "A", "name": "n1", "devices": 2, "cpus": cpus})
        assert e.value.fields["field"] == "cpus", cpus


def _gpu(uuid: str = "GPU-a", **kw: object) -> dict[str, object]:
    return {"index": 0, "uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "memory_bytes": 1 << 30, **kw}


def test_a_registration_of_gpu_devices_names_one_gpu_per_device() -> None:
    base = {"agent_id": "A", "name": "n1", "devices": 2, "cpus": [[0], [1]]}
    assert protocol.decode(protocol.Register, base).gpus is None  # a CPU node, and agents from before GPUs
    cases = {
        "1 GPUs for 2 device(s): give one per device": [_gpu()],
        "two devices name the same GPU: each device is a GPU of its own": [_gpu(), _gpu(index=1)],
    }
    for message, gpus in cases.items():
        with pytest.raises(ValidationError) as e:
            protocol.decode(protocol.Register, {**base, "gpus": gpus})
        assert e.value.fields["field"] == "gpus" and message in e.value.message, e.value
    for field, gpu in {"gpus.1.uuid": _gpu("GPU b/../x"), "gpus.1.model": _gpu("GPU-b", model="H100\n"),
                       "gpus.1.memory_bytes": _gpu("GPU-b", memory_bytes=-1),
                       "gpus.1.kind": _gpu("GPU-b", kind="gpu")}.items():
        with pytest.raises(ValidationError) as e:
            protocol.decode(protocol.Register, {**base, "gpus": [_gpu(), gpu]})
        assert e.value.fields["field"] == field, (field, e.value)


def test_figures_that_are_not_finite_are_left_out_of_a_heartbeat() -> None:
    hb = protocol.decode(protocol.Heartbeat, {"agent_id": "A", "jobs": {"j1": {"a": float("nan"), "b": 1.0,
                                                                              "c": float("inf")}}})
    assert hb.jobs == {"j1": {"b": 1.0}}


def test_error_text_that_is_not_valid_unicode_is_kept_escaped() -> None:
    res = protocol.decode(protocol.ActionResult, {"agent_id": "A", "action_id": "a-1", "ok": False,
                                                  "error": "no file \udcff"})
    assert res.error == "no file \\udcff"
    json.dumps(protocol.encode(res)).encode()
