"""The device-state step against a fake driver (logic only: the order of driver calls, timeouts, failure
paths that leave every process as it was, GPU remapping). The real driver runs in tests/gpu."""

from __future__ import annotations

import pytest

from tidal.errors import CheckpointError, MechanismError, Unsupported
from tidal.mechanisms.gpu.devicestate import DeviceState, remap_for, visible
from tidal.mechanisms.gpu.driver import CHECKPOINTED, RUNNING, uuid_bytes, uuid_text
from tidal.testing.cudadriver import U0, U1, FakeDriver


def make(drv: FakeDriver, holding: set[int], keep_after_checkpoint: set[int] = frozenset()) -> DeviceState:  # type: ignore[assignment]
    """Processes in ``holding`` hold /dev/nvidia0 until checkpointed (those in ``keep_after_checkpoint``:
    also after)."""
    def fds(pid: int) -> list[str]:
        if pid in holding and (drv.states.get(pid) != CHECKPOINTED or pid in keep_after_checkpoint):
            return ["/dev/nvidia0", "/dev/nvidiactl"]
        return []
    return DeviceState(lambda: drv, lock_timeout=2.5, fds=fds)


def test_cpu_ranks_never_load_the_driver() -> None:
    def no_driver() -> FakeDriver:
        raise AssertionError("the driver was loaded for a CPU rank")
    step = DeviceState(no_driver, fds=lambda pid: [])
    assert step.suspend("job/0", [10, 11]) == []


def test_every_cuda_process_is_locked_before_any_is_checkpointed() -> None:
    drv = FakeDriver()
    step = make(drv, {11, 12})
    assert step.suspend("job/0", [10, 11, 12]) == [11, 12]
    assert drv.calls == [("lock", 11, 2500), ("lock", 12, 2500), ("checkpoint", 11), ("checkpoint", 12)]
    assert step.resume("job/0", [10, 11, 12]) == [11, 12]
    assert drv.calls[4:] == [("restore", 11, None), ("unlock", 11), ("restore", 12, None), ("unlock", 12)]
    assert drv.states == {11: RUNNING, 12: RUNNING}


def test_lock_timeout_unlocks_those_locked_and_says_why() -> None:
    drv = FakeDriver(fail={("lock", 12): "CUDA_ERROR_TIMEOUT"})
    step = make(drv, {11, 12})
    with pytest.raises(CheckpointError) as err:
        step.suspend("job/0", [11, 12])
    assert err.value.message == ("GPU state of rank job/0 could not be checkpointed: cuCheckpointProcessLock for "
                                 "process 12 failed: CUDA_ERROR_TIMEOUT (909)")
    assert "lock timeout" in (err.value.hint or "") and "the job goes on" in (err.value.hint or "")
    assert drv.calls == [("lock", 11, 2500), ("lock", 12, 2500), ("unlock", 11)]  # 12 never got locked
    assert drv.states[11] == RUNNING


def test_checkpoint_failure_puts_back_what_was_checkpointed() -> None:
    drv = FakeDriver(fail={("checkpoint", 12): "CUDA_ERROR_NOT_SUPPORTED"})
    step = make(drv, {11, 12})
    with pytest.raises(CheckpointError, match="CUDA_ERROR_NOT_SUPPORTED") as err:
        step.suspend("job/0", [11, 12])
    assert "IPC" in (err.value.hint or "")
    assert drv.calls[2:] == [("checkpoint", 11), ("checkpoint", 12), ("restore", 11, None), ("unlock", 11),
                             ("unlock", 12)]
    assert drv.states == {11: RUNNING, 12: RUNNING}


def test_device_files_left_after_the_checkpoint_are_refused_and_undone() -> None:
    drv = FakeDriver()
    step = make(drv, {11}, keep_after_checkpoint={11})
    with pytest.raises(Unsupported) as err:
        step.suspend("job/0", [11])
    assert err.value.message == ("rank job/0: process 11 still holds /dev/nvidia0, /dev/nvidiactl after its GPU "
                                 "state was checkpointed, which CRIU cannot dump")
    assert drv.calls[-2:] == [("restore", 11, None), ("unlock", 11)]


def test_resume_remaps_and_skips_processes_without_gpu_state() -> None:
    drv = FakeDriver()
    drv.states = {21: CHECKPOINTED, 22: RUNNING}
    step = make(drv, set())
    assert step.resume("job/1", [20, 21, 22], {U0: U1}) == [21]
    assert drv.calls == [("restore", 21, {U0: U1}), ("unlock", 21)]


def test_a_failed_restore_names_the_rank_and_process() -> None:
    drv = FakeDriver(fail={("restore", 21): "CUDA_ERROR_OUT_OF_MEMORY"})
    drv.states = {21: CHECKPOINTED}
    with pytest.raises(MechanismError) as err:
        make(drv, set()).resume("job/1", [21])
    assert err.value.message == ("GPU state of rank job/1 (process 21, checkpointed) could not be restored: "
                                 "cuCheckpointProcessRestore for process 21 failed: CUDA_ERROR_OUT_OF_MEMORY (909)")
    assert err.value.hint == "the GPU it is restored onto has too little free memory"


@pytest.mark.parametrize(("value", "expected"), [
    (None, [U0, U1]), ("1", [U1]), ("1,0", [U1, U0]), ("", []), ("0,7,1", [U0]), (U1, [U1]), ("GPU-1111", [U1]),
    ("GPU-", []),
])
def test_visible_gpus_follow_cuda_rules(value: str | None, expected: list[str]) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible(env, [U0, U1]) == expected


def test_remap_pairs_every_checkpointed_gpu() -> None:
    assert remap_for([U0], [U0]) is None
    assert remap_for([U0, U1], [U1, U0]) == {U0: U1, U1: U0}
    with pytest.raises(CheckpointError, match="checkpointed with 2 GPU\\(s\\) and is given 1 now"):
        remap_for([U0, U1], [U0])


def test_uuid_spelling_round_trips() -> None:
    raw = uuid_bytes(U0)
    assert len(raw) == 16 and uuid_text(raw) == U0
    with pytest.raises(MechanismError, match="not a GPU UUID"):
        uuid_bytes("GPU-12")
