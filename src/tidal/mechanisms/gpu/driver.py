"""The CUDA driver's process checkpoint API (``cuCheckpointProcess*``, driver ≥ 550, GPU remapping ≥ 570),
called through ctypes from the node's own process: it needs no CUDA toolkit, no ``cuda-checkpoint`` binary
and nothing from the job.

A process is locked (its CUDA calls block, in-flight work completes), checkpointed (device memory moves to
host memory and every device handle is released, so CRIU can dump it like any process), and after a CRIU
restore restored (host memory back to a GPU, optionally another one) and unlocked."""

from __future__ import annotations

import ctypes
import threading
from typing import Protocol

from tidal.errors import MechanismError

# CUprocessState
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: "running", LOCKED: "locked", CHECKPOINTED: "checkpointed", FAILED: "failed"}
# The API calls it needs; cuDeviceGetUuid_v2 names GPUs for remapping.
API = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
       "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState")


class DriverError(MechanismError):
    """A driver call failed (:meth:`of`): its fields ``call``, ``code`` (the CUresult), ``name`` (its
    symbolic name) and ``pid``."""

    @classmethod
    def of(cls, call: str, code: int, name: str, pid: int | None = None) -> DriverError:
        target = f" for process {pid}" if pid is not None else ""
        return cls(f"{call}{target} failed: {name} ({code})", hint=_HINTS.get(name, "see `tidal doctor`"),
                   call=call, code=code, name=name, pid=pid)


_HINTS = {
    "CUDA_ERROR_TIMEOUT": "the process kept the GPU busy past the lock timeout (a long kernel?): try again later",
    "CUDA_ERROR_NOT_SUPPORTED": "the process uses a CUDA feature the driver cannot checkpoint (IPC memory, UVM, "
                                "MPS): it cannot be checkpointed on this driver",
    "CUDA_ERROR_NOT_INITIALIZED": "the process holds no CUDA context",
    "CUDA_ERROR_INVALID_VALUE": "the process is not in the state this step expects (see its CUDA state)",
    "CUDA_ERROR_OUT_OF_MEMORY": "the GPU it is restored onto has too little free memory",
}


class Driver(Protocol):
    """What the device-state step needs of the driver (a fake one in unit tests)."""

    def state(self, pid: int) -> int | None: ...

    def lock(self, pid: int, timeout_ms: int) -> None: ...

    def checkpoint(self, pid: int) -> None: ...

    def restore(self, pid: int, remap: dict[str, str] | None = None) -> None: ...

    def unlock(self, pid: int) -> None: ...

    def uuids(self) -> list[str]: ...


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class _Reserved(ctypes.Structure):  # CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class _GpuPair(ctypes.Structure):
    _fields_ = [("old", _Uuid), ("new", _Uuid)]


class _RestoreArgs(ctypes.Structure):  # 64 bytes: the pairs, their count, then zeroes
    _fields_ = [("gpuPairs", ctypes.POINTER(_GpuPair)), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_char * 52)]


def uuid_text(raw: bytes) -> str:
    """NVML's spelling of a GPU's UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def uuid_bytes(text: str) -> bytes:
    h = text.removeprefix("GPU-").replace("-", "")
    if len(h) != 32:
        raise MechanismError(f"not a GPU UUID: {text!r}", hint="GPU UUIDs look like GPU-xxxxxxxx-xxxx-…")
    return bytes.fromhex(h)


class CudaDriver:
    """``libcuda.so.1``'s checkpoint API. :meth:`load` fails with what is missing, and says what to do."""

    _lock = threading.Lock()
    _loaded: CudaDriver | None = None

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.version = self._version()

    @classmethod
    def load(cls) -> CudaDriver:
        with cls._lock:
            if cls._loaded is None:
                try:
                    lib = ctypes.CDLL("libcuda.so.1")
                except OSError as exc:
                    raise MechanismError(f"no NVIDIA driver here: cannot load libcuda.so.1 ({exc})",
                                         hint="install the NVIDIA driver, or run GPU jobs on GPU nodes") from None
                missing = [n for n in API if not hasattr(lib, n)]
                if missing:
                    raise MechanismError(f"the NVIDIA driver here has no process checkpoint API (missing "
                                         f"{', '.join(missing)})",
                                         hint="GPU jobs need driver 570 or newer to be checkpointed")
                drv = cls(lib)
                drv._call("cuInit", ctypes.c_uint(0))  # restore needs an initialised driver in the caller
                cls._loaded = drv
            return cls._loaded

    def _version(self) -> int:
        v = ctypes.c_int()
        self.lib.cuDriverGetVersion(ctypes.byref(v))
        return v.value

    def _error_name(self, code: int) -> str:
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorName(ctypes.c_int(code), ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {code}"

    def _call(self, name: str, *args: object, pid: int | None = None) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise DriverError.of(name, code, self._error_name(code), pid)

    def state(self, pid: int) -> int | None:
        """The process's CUDA state; None when it holds no CUDA context."""
        s = ctypes.c_int()
        code = self.lib.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(s))
        if code != 0:
            return None
        return s.value

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", ctypes.c_int(pid), ctypes.byref(args), pid=pid)

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", ctypes.c_int(pid), ctypes.byref(_Reserved()), pid=pid)

    def restore(self, pid: int, remap: dict[str, str] | None = None) -> None:
        args = _RestoreArgs()
        if remap:
            pairs = (_GpuPair * len(remap))()
            for i, (old, new) in enumerate(sorted(remap.items())):
                pairs[i].old.bytes[:] = uuid_bytes(old)
                pairs[i].new.bytes[:] = uuid_bytes(new)
            args.gpuPairs = ctypes.cast(pairs, ctypes.POINTER(_GpuPair))
            args.gpuPairsCount = len(remap)
        self._call("cuCheckpointProcessRestore", ctypes.c_int(pid), ctypes.byref(args), pid=pid)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", ctypes.c_int(pid), ctypes.byref(_Reserved()), pid=pid)

    def uuids(self) -> list[str]:
        """The UUIDs of the GPUs this process sees, by index."""
        n = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(n))
        get_uuid = getattr(self.lib, "cuDeviceGetUuid_v2", None) or self.lib.cuDeviceGetUuid
        out = []
        for i in range(n.value):
            dev = ctypes.c_int()
            self._call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(i))
            u = _Uuid()
            code = get_uuid(ctypes.byref(u), dev)
            if code != 0:
                raise DriverError.of("cuDeviceGetUuid", code, self._error_name(code))
            out.append(uuid_text(bytes(u.bytes)))
        return out
