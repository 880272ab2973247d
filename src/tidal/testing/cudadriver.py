"""A stand-in for the CUDA driver's process checkpoint API (:class:`tidal.mechanisms.gpu.driver.Driver`), for
testing the device-state step where there is no GPU: it records the calls, keeps each process's CUDA state,
and fails a call on demand with the driver error's name."""

from __future__ import annotations

from tidal.mechanisms.gpu.driver import CHECKPOINTED, LOCKED, RUNNING, DriverError

U0 = "GPU-c9ad5920-62b3-e699-9822-b43ca91e8cd4"
U1 = "GPU-11111111-2222-3333-4444-555555555555"


class FakeDriver:
    """``fail``: (call, pid) → the error name that call fails with; :meth:`uuids`: two GPUs."""

    def __init__(self, fail: dict[tuple[str, int], str] | None = None) -> None:
        self.calls: list[tuple[str, int] | tuple[str, int, object]] = []
        self.states: dict[int, int] = {}
        self.fail = fail or {}

    def _maybe_fail(self, call: str, pid: int) -> None:
        name = self.fail.get((call, pid))
        if name:
            raise DriverError.of(f"cuCheckpointProcess{call.capitalize()}", 909, name, pid)

    def state(self, pid: int) -> int | None:
        return self.states.get(pid)

    def lock(self, pid: int, timeout_ms: int) -> None:
        self.calls.append(("lock", pid, timeout_ms))
        self._maybe_fail("lock", pid)
        self.states[pid] = LOCKED

    def checkpoint(self, pid: int) -> None:
        self.calls.append(("checkpoint", pid))
        self._maybe_fail("checkpoint", pid)
        self.states[pid] = CHECKPOINTED

    def restore(self, pid: int, remap: dict[str, str] | None = None) -> None:
        self.calls.append(("restore", pid, remap))
        self._maybe_fail("restore", pid)
        self.states[pid] = LOCKED

    def unlock(self, pid: int) -> None:
        self.calls.append(("unlock", pid))
        self.states[pid] = RUNNING

    def uuids(self) -> list[str]:
        return [U0, U1]
