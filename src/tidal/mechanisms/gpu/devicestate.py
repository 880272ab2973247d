"""The device-state step of a checkpoint: a no-op for CPU ranks; for CUDA ranks it moves the GPU's state
into the processes' host memory before CRIU freezes and dumps them, and back after the dump (the job goes
on) or after a CRIU restore (onto the GPUs the rank is given now).

Order, per checkpoint: the interposer's cut has dropped NCCL (no communicator left) → :meth:`suspend`
locks every CUDA process of the rank, then checkpoints each → freeze, CRIU dump → thaw → :meth:`resume`.
If any step fails, what was done is undone and the rank runs on as before."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping

from tidal.errors import CheckpointError, MechanismError, Unsupported
from tidal.mechanisms.gpu.driver import CHECKPOINTED, LOCKED, STATE_NAMES, CudaDriver, Driver, DriverError

log = logging.getLogger(__name__)

DEVICE_PREFIX = "/dev/nvidia"


def device_fds(pid: int) -> list[str]:
    """The NVIDIA device files ``pid`` holds open (a process with a CUDA context holds some)."""
    out: list[str] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(DEVICE_PREFIX):
            out.append(target)
    return out


def visible(env: Mapping[str, str], uuids: list[str]) -> list[str]:
    """The UUIDs of the GPUs a process started with ``env`` sees, in its order (CUDA_VISIBLE_DEVICES holds
    indices of this node's GPUs or UUIDs; unset: all of them)."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(uuids)
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            break
        if item.isdigit():
            if int(item) >= len(uuids):
                break  # CUDA stops at the first invalid entry
            out.append(uuids[int(item)])
        else:
            match = [u for u in uuids if u == item or u.startswith(item)]
            if len(match) != 1:
                break
            out.append(match[0])
    return out


def remap_for(old: list[str], new: list[str]) -> dict[str, str] | None:
    """The driver's GPU pairs for a rank that saw ``old`` at its checkpoint and is given ``new`` now: None
    when nothing moves; every checkpointed GPU otherwise (the driver wants them all)."""
    if old == new:
        return None
    if len(old) != len(new):
        raise CheckpointError(f"the rank was checkpointed with {len(old)} GPU(s) and is given {len(new)} now",
                              hint="restore it with as many GPUs as it had")
    return dict(zip(old, new, strict=True))


class DeviceState:
    """The step, over a driver (the real one loads only when a rank holds a GPU)."""

    def __init__(self, driver: Callable[[], Driver] = CudaDriver.load, lock_timeout: float = 30.0,
                 fds: Callable[[int], list[str]] = device_fds) -> None:
        self._driver_factory = driver
        self._driver: Driver | None = None
        self.lock_timeout = lock_timeout
        self._fds = fds

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = self._driver_factory()
        return self._driver

    def cuda_pids(self, pids: Iterable[int]) -> list[int]:
        return [p for p in pids if self._fds(p)]

    def suspend(self, name: str, pids: list[int]) -> list[int]:
        """Lock, then checkpoint every CUDA process of rank ``name``; the processes checkpointed (none for
        a CPU rank). On failure everything is undone and :class:`CheckpointError` says why."""
        cuda = self.cuda_pids(pids)
        if not cuda:
            return []
        drv = self.driver
        locked: list[int] = []
        done: list[int] = []
        try:
            for pid in cuda:  # all locked before any is checkpointed: none runs on with half its peers' state
                drv.lock(pid, int(self.lock_timeout * 1000))
                locked.append(pid)
            for pid in cuda:
                drv.checkpoint(pid)
                done.append(pid)
            left = {p: self._fds(p) for p in cuda}
            left = {p: f for p, f in left.items() if f}
            if left:
                pid, files = next(iter(left.items()))
                raise Unsupported(f"rank {name}: process {pid} still holds {', '.join(sorted(set(files)))} after "
                                  "its GPU state was checkpointed, which CRIU cannot dump",
                                  hint="the process opens NVIDIA devices outside CUDA (e.g. NVML or IPC): "
                                       "it cannot be checkpointed; the job goes on")
        except (DriverError, Unsupported) as exc:
            self._undo(name, done, locked)
            if isinstance(exc, Unsupported):
                raise
            raise CheckpointError(f"GPU state of rank {name} could not be checkpointed: {exc.message}",
                                  hint=f"{exc.hint}; the job goes on, its last good checkpoint is untouched") \
                from exc
        log.debug("rank %s: GPU state of %s moved to host memory", name, cuda)
        return done

    def _undo(self, name: str, done: list[int], locked: list[int]) -> None:
        for pid in done:
            try:
                self.driver.restore(pid)
            except DriverError as exc:
                log.error("rank %s: GPU state of process %d could not be put back: %s", name, pid, exc.message)
        for pid in locked:
            try:
                self.driver.unlock(pid)
            except DriverError as exc:
                log.error("rank %s: process %d could not be unlocked: %s", name, pid, exc.message)

    def resume(self, name: str, pids: list[int], remap: dict[str, str] | None = None) -> list[int]:
        """Restore (onto the GPUs of ``remap``, default: the same ones) and unlock every checkpointed or
        locked CUDA process among ``pids``; the processes resumed."""
        drv = self.driver
        out = []
        for pid in pids:
            state = drv.state(pid)
            if state is None or state not in (CHECKPOINTED, LOCKED):
                continue
            try:
                if state == CHECKPOINTED:
                    drv.restore(pid, remap)
                drv.unlock(pid)
            except DriverError as exc:
                raise MechanismError(f"GPU state of rank {name} (process {pid}, {STATE_NAMES.get(state)}) could "
                                     f"not be restored: {exc.message}", hint=exc.hint) from exc
            out.append(pid)
        return out

    def gpus(self, env: Mapping[str, str]) -> list[str]:
        """The UUIDs of the GPUs a rank started with ``env`` uses."""
        return visible(env, self.driver.uuids())
