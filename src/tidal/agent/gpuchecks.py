"""``tidal doctor``'s GPU rows: what this machine's NVIDIA GPUs offer an agent (``--devices auto``) and
whether their jobs can be checkpointed.

The rows, in order: ``gpus`` (what NVML finds), ``nvml`` (NVIDIA's management library and its Python
module), ``nvidia driver`` (its version: the CUDA driver's checkpoint API needs ≥ 570), ``cuda driver``
(``cuDriverGetVersion`` of ``libcuda.so.1``), ``cuda checkpoint api`` (whether ``libcuda.so.1`` exports the
functions the device-state step calls) and ``nccl`` (the NCCL of the torch that jobs run with, asked in a
separate Python process so that the doctor never imports torch). On a machine without an NVIDIA GPU every
row is ``ok`` and says so: a CPU node needs none of it. The rows are never required: jobs on CPU devices run
without them.

Each probe is a parameter (NVML, the CUDA library, the torch probe), so that the rows' logic runs against
fakes.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, Protocol

from tidal.agent import gpus as gpus_mod
from tidal.agent.gpus import Nvml
from tidal.errors import ConfigError, MechanismError
from tidal.mechanisms.checks import Check, Planned

NO_GPU_ROW = "no NVIDIA GPU (CPU devices only)"
ROWS = ("gpus", "nvml", "nvidia driver", "cuda driver", "cuda checkpoint api", "nccl")
#: The driver API the device-state step calls: a driver that lacks one cannot checkpoint GPU jobs.
CHECKPOINT_API = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                  "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState")
MIN_DRIVER = (570,)
UPGRADE_DRIVER = "upgrade the NVIDIA driver to 570 or later (it brings the CUDA driver's checkpoint API)"
INSTALL_NVML = "pip install 'tidal[gpu]' (nvidia-ml-py) in Tidal's environment"
GIB = 1 << 30


class LibCuda(Protocol):
    """What the rows ask of ``libcuda.so.1``."""

    def driver_version(self) -> int: ...
    def exports(self, name: str) -> bool: ...


class CtypesCuda:
    """``libcuda.so.1`` through ctypes (``lib``: the loaded library, or an object with its functions)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def driver_version(self) -> int:
        v = ctypes.c_int(0)
        rc = self.lib.cuDriverGetVersion(ctypes.byref(v))
        if rc != 0:
            raise MechanismError(f"cuDriverGetVersion returned CUDA error {rc}", code=rc)
        return int(v.value)

    def exports(self, name: str) -> bool:
        return hasattr(self.lib, name)


def load_libcuda() -> LibCuda:
    """The CUDA driver library of this machine (ctypes raises OSError when it cannot be loaded)."""
    return CtypesCuda(ctypes.CDLL("libcuda.so.1"))


def probe_torch(python: str | None = None, timeout: float = 60.0) -> dict[str, Any] | None:
    """What the torch of ``python`` (default: this one) says of CUDA and NCCL, asked in a child process (the
    doctor never imports torch): ``{"torch", "cuda", "available", "nccl"}``, or None when torch is not
    installed. A child that fails says so in ``error``."""
    if python is None and importlib.util.find_spec("torch") is None:
        return None
    code = ("import json, torch\n"
            "ok = torch.cuda.is_available()\n"
            "n = torch.cuda.nccl.version() if ok and torch.distributed.is_nccl_available() else None\n"
            "n = '.'.join(map(str, n)) if isinstance(n, tuple) else n\n"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': ok, "
            "'nccl': n}))\n")
    try:
        out = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return {"error": last}
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"unexpected output: {out.stdout[-200:]!r}"}
    return data if isinstance(data, dict) else {"error": f"unexpected output: {out.stdout[-200:]!r}"}


def nccl_text(version: Any) -> str:
    """NCCL's version as torch gives it (a tuple turned to ``2.28.3`` by the probe, or an old integer code:
    ``22803`` from NCCL 2.9 on, ``2708`` before) as text."""
    if isinstance(version, int):
        major, rest = (version // 10000, version % 10000) if version >= 20900 else (version // 1000, version % 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return str(version)


def _no_gpu_rows() -> list[Check]:
    return [Check(name, "ok", NO_GPU_ROW) for name in ROWS]


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def nvidia_gpus_present(root: str = "/proc/driver/nvidia/gpus") -> bool:
    """Whether the NVIDIA kernel module lists a GPU (looked at only where NVML cannot be asked)."""
    try:
        return any(os.scandir(root))
    except OSError:
        return False


def gpu_rows(nvml: Callable[[], Nvml] = gpus_mod.load_nvml,
             libcuda: Callable[[], LibCuda] = load_libcuda,
             torch: Callable[[], dict[str, Any] | None] = probe_torch,
             present: Callable[[], bool] = nvidia_gpus_present) -> list[Check]:
    """The doctor's GPU rows (see the module's text). ``nvml`` loads the NVML bindings, ``libcuda`` the CUDA
    driver library, ``torch`` asks the jobs' torch about CUDA and NCCL; ``present`` says whether the kernel
    lists NVIDIA GPUs, asked only when the NVML module is missing."""
    try:
        inventory = gpus_mod.discover(nvml())
    except ConfigError as exc:
        reason = exc.fields.get("reason")
        if reason in (gpus_mod.NO_DRIVER, gpus_mod.NO_GPU) or (reason == gpus_mod.NO_MODULE and not present()):
            return _no_gpu_rows()
        if reason == gpus_mod.NO_MODULE:  # the kernel lists GPUs that cannot be listed through NVML
            rows = [Check("gpus", "warn", "the NVIDIA driver lists GPUs (/proc/driver/nvidia/gpus), but they cannot "
                          "be offered: nvidia-ml-py is not installed", INSTALL_NVML),
                    Check("nvml", "warn", "nvidia-ml-py (pynvml) is not installed", INSTALL_NVML),
                    Check("nvidia driver", "warn", "unknown: NVML is needed to read it", INSTALL_NVML)]
        else:
            rows = [Check("gpus", "warn", exc.message, exc.hint or ""),
                    Check("nvml", "warn", exc.message, exc.hint or ""),
                    Check("nvidia driver", "warn", "unknown: NVML failed", exc.hint or "")]
        return [*rows, *_cuda_rows(libcuda), _nccl_row(torch())]
    listed = "; ".join(f"GPU {g.index}: {g.model}, {_gib(g.memory_bytes)} ({_gib(g.memory_used_bytes)} in use)"
                       for g in inventory.gpus)
    rows = [Check("gpus", "ok", f"{len(inventory.gpus)} GPU(s): {listed}"),
            Check("nvml", "ok", f"NVML {inventory.nvml_version}")]
    version = _driver_tuple(inventory.driver_version)
    if version is not None and version[:1] >= MIN_DRIVER:
        rows.append(Check("nvidia driver", "ok", inventory.driver_version))
    else:
        rows.append(Check("nvidia driver", "warn", f"{inventory.driver_version}: older than 570, the first with the "
                          "CUDA driver's checkpoint API", UPGRADE_DRIVER))
    return [*rows, *_cuda_rows(libcuda), _nccl_row(torch())]


def _driver_tuple(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in text.split("."))
    except ValueError:
        return None


def _cuda_rows(libcuda: Callable[[], LibCuda]) -> list[Check]:
    try:
        cuda = libcuda()
    except OSError as exc:
        why = f"libcuda.so.1 cannot be loaded: {exc}"
        fix = "install the NVIDIA driver's CUDA library (libcuda.so.1) where Tidal's agent runs"
        return [Check("cuda driver", "warn", why, fix), Check("cuda checkpoint api", "warn", why, fix)]
    try:
        v = cuda.driver_version()
        version = Check("cuda driver", "ok", f"{gpus_mod.cuda_version_text(v)} (cuDriverGetVersion: {v})")
    except MechanismError as exc:
        version = Check("cuda driver", "warn", exc.message, "check the NVIDIA driver (`nvidia-smi` must run)")
    missing = [name for name in CHECKPOINT_API if not cuda.exports(name)]
    if not missing:
        api = Check("cuda checkpoint api", "ok", "libcuda.so.1 exports " + ", ".join(CHECKPOINT_API))
    else:
        api = Check("cuda checkpoint api", "warn", f"libcuda.so.1 lacks {', '.join(missing)}: GPU jobs cannot be "
                    "checkpointed", UPGRADE_DRIVER)
    return [version, api]


def _nccl_row(probe: dict[str, Any] | None) -> Check:
    if probe is None:
        return Check("nccl", "warn", f"torch is not installed in {sys.executable}: no NCCL to check",
                     "pip install 'tidal[torch]' (a CUDA build of torch) in the jobs' environment")
    if probe.get("error"):
        return Check("nccl", "warn", f"could not ask torch: {probe['error']}",
                     "check that `python -c 'import torch'` works in the jobs' environment")
    torch_v, cuda_v = probe.get("torch"), probe.get("cuda")
    if not cuda_v:
        return Check("nccl", "warn", f"torch {torch_v} is built without CUDA",
                     "install a CUDA build of torch in the jobs' environment")
    if not probe.get("available"):
        return Check("nccl", "warn", f"torch {torch_v} (CUDA {cuda_v}) cannot use the GPUs: "
                     "torch.cuda.is_available() is false",
                     "install a torch whose CUDA the driver supports (`tidal doctor`: cuda driver)")
    if probe.get("nccl") is None:
        return Check("nccl", "warn", f"torch {torch_v} (CUDA {cuda_v}) has no NCCL",
                     "install a torch built with NCCL (the CUDA wheels are)")
    return Check("nccl", "ok", f"{nccl_text(probe['nccl'])} (torch {torch_v}, CUDA {cuda_v})")


def planned() -> list[Planned]:
    """The GPU rows as one planned check of ``tidal doctor``."""
    return [Planned("gpus", False, gpu_rows)]
