"""A multi-node step's checkpoints in a real (local) store: the record that commits the parts, retention of
the records and of the parts they name, and what a task's share of a cut refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.errors import ValidationError
from tidal.mechanisms.slurm import multitask
from tidal.mechanisms.storage import CheckpointStore


def _part(store: CheckpointStore, key: str, part: str, tmp: Path) -> None:
    f = tmp / f"{part}.bin"
    f.write_bytes(part.encode() * 100)
    w = store.writer(key, part)
    w.add_file("ranks/0/output.log", f)
    w.commit({"ranks": {}})


def test_a_step_checkpoint_names_its_parts_and_retention_keeps_only_the_named_ones(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"))
    key = "4711"
    assert multitask.latest(store, key) is None
    for n in (1, 2, 3):
        for task in (0, 1):
            _part(store, key, f"00000{n}-aaaaaa.p{task}", tmp_path)
        multitask.commit(store, key, f"00000{n}-aaaaaa", [f"00000{n}-aaaaaa.p0", f"00000{n}-aaaaaa.p1"], 2, keep=2)
    # A checkpoint that failed on one task: its other part is stored, but no record names it.
    _part(store, key, "000004-bbbbbb.p0", tmp_path)
    assert multitask.latest(store, key) == multitask.StepCheckpoint(
        "000003-aaaaaa", ("000003-aaaaaa.p0", "000003-aaaaaa.p1"), 2)
    multitask.commit(store, key, "000005-cccccc", ["000003-aaaaaa.p0", "000003-aaaaaa.p1"], 2, keep=2)
    assert [i.id for i in store.list(multitask.records_key(key))] == ["000003-aaaaaa", "000005-cccccc"]
    assert [i.id for i in store.list(key)] == ["000003-aaaaaa.p0", "000003-aaaaaa.p1"]
    multitask.delete(store, key)
    assert store.list(key) == [] and store.list(multitask.records_key(key)) == []


class _NoJob:
    """A share's job that must not be reached: the orders below are refused before."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"job.{name} reached")


@pytest.mark.parametrize(("msg", "error"), [
    ({"op": "report", "epoch": -1}, "epoch must be a non-negative integer, not -1"),
    ({"op": "park", "epoch": 1, "plan": {"targets": {"g": "9"}, "members": {}, "version": 0}},
     "target must be a non-negative integer, not '9'"),
    ({"op": "park", "epoch": 1, "plan": {"targets": {"x" * 200: 1}, "members": {}, "version": 0}},
     "a communicator's name must be 1 to 128 characters"),
    ({"op": "supersede", "epoch": 1, "version": None}, "version must be a non-negative integer, not None"),
    ({"op": "dump", "epoch": 1, "target": 2, "then": "kill", "part": "x"}, "then must be 'continue' or 'hold'"),
    ({"op": "dump", "epoch": 1, "target": 2, "then": "hold", "part": "../x"}, "invalid checkpoint id '../x'"),
    ({"op": "reboot"}, "unknown step order 'reboot'"),
])
def test_a_share_refuses_a_malformed_order(tmp_path: Path, msg: dict[str, Any], error: str) -> None:
    share = multitask.Share(_NoJob(), CheckpointStore(str(tmp_path / "store")), "4711")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=error.replace("(", r"\(").replace(")", r"\)")):
        share.handle(msg)
