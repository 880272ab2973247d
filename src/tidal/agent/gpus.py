"""NVIDIA GPUs as devices: what NVML finds on this machine, and the environment that gives a rank its GPU.

Discovery goes through NVML with NVIDIA's Python bindings (``nvidia-ml-py``, imported as ``pynvml``; an
optional dependency: ``pip install 'tidal[gpu]'``). The module is imported only when GPUs are asked for
(``tidal agent --devices auto``, ``tidal doctor``), and :func:`discover` takes any object with pynvml's
functions, so that the logic runs against a fake NVML where there is no GPU.

A GPU node offers one device per GPU, device ``i`` being the GPU of NVML index ``i``. A rank placed on a GPU
device sees that GPU alone, as ``cuda:0``: :func:`rank_env` sets ``CUDA_VISIBLE_DEVICES`` to the GPU's
UUID, not to its index, because NVML numbers GPUs in PCI bus order while CUDA's default order is fastest
first (an index names another GPU unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); a UUID names one GPU in every
order. Ranks spliced onto one device (D < W) all get the same GPU. CPU devices get no CUDA variable.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from tidal.errors import ConfigError, MechanismError

#: NVML's return codes that mean "no NVIDIA driver here" (``nvml.h``): the library is not installed, or its
#: kernel module is not loaded.
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12

#: Why :func:`discover` found no GPU to offer (the ``reason`` field of its :class:`ConfigError`).
NO_MODULE = "no-nvml-module"  # nvidia-ml-py is not installed
NO_DRIVER = "no-driver"  # NVML's library or the driver's kernel module is not there
NO_GPU = "no-gpu"  # NVML answers, and counts no GPU
NVML_FAILED = "nvml-failed"  # NVML answered with another error

CPU_DEVICES_HINT = "give --devices N to offer N CPU devices instead"


class Nvml(Protocol):
    """The part of ``pynvml`` that discovery and :func:`process_memory` call (a fake NVML in tests implements
    the same)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlSystemGetNVMLVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML sees it: its index, UUID (``GPU-…``), model name and memory in bytes (``used``: in
    use when it was looked at, by any process)."""

    index: int
    uuid: str
    model: str
    memory_bytes: int
    memory_used_bytes: int


@dataclass(frozen=True)
class Inventory:
    """This machine's GPUs, in NVML's index order, and its driver: ``driver_version`` as NVIDIA numbers it
    (``580.159.04``), ``cuda_driver_version`` as CUDA does (``13000`` for CUDA 13.0)."""

    driver_version: str
    cuda_driver_version: int
    nvml_version: str
    gpus: tuple[Gpu, ...]


def cuda_version_text(version: int) -> str:
    """CUDA's version number as people write it: 13000 → ``13.0``, 12080 → ``12.8``."""
    return f"{version // 1000}.{version % 1000 // 10}"


def load_nvml() -> Nvml:
    """The real NVML bindings (``pynvml`` of ``nvidia-ml-py``), or a ConfigError saying how to get them."""
    try:
        return cast(Nvml, importlib.import_module("pynvml"))
    except ImportError:
        raise ConfigError("the NVML Python module (nvidia-ml-py, imported as pynvml) is not installed, so this "
                          "machine's NVIDIA GPUs cannot be listed",
                          hint="pip install 'tidal[gpu]' (or nvidia-ml-py) in Tidal's environment; "
                               + CPU_DEVICES_HINT, reason=NO_MODULE) from None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def discover(nvml: Nvml | None = None) -> Inventory:
    """Every NVIDIA GPU of this machine, through ``nvml`` (default: the real bindings, :func:`load_nvml`).

    Raises :class:`ConfigError` when there is none to offer, its ``reason`` field saying why: the module is
    missing (:data:`NO_MODULE`), there is no driver (:data:`NO_DRIVER`), NVML counts no GPU (:data:`NO_GPU`),
    or NVML failed otherwise (:data:`NVML_FAILED`)."""
    nvml = nvml if nvml is not None else load_nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED):
            what = ("NVML's library (libnvidia-ml.so.1) is not installed" if code == NVML_ERROR_LIBRARY_NOT_FOUND
                    else "the NVIDIA driver's kernel module is not loaded")
            raise ConfigError(f"no NVIDIA GPU found: {what}",
                              hint=f"{CPU_DEVICES_HINT}, or install the NVIDIA driver", reason=NO_DRIVER) from None
        raise ConfigError(f"NVML failed to start: {_nvml_error(exc)}",
                          hint=f"check the NVIDIA driver (`nvidia-smi` must list the GPUs); {CPU_DEVICES_HINT}",
                          reason=NVML_FAILED) from None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        version = _text(nvml.nvmlSystemGetNVMLVersion())
        gpus = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(index=i, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                            model=_text(nvml.nvmlDeviceGetName(handle)), memory_bytes=int(mem.total),
                            memory_used_bytes=int(mem.used)))
    except nvml.NVMLError as exc:
        raise ConfigError(f"NVML failed listing the GPUs: {_nvml_error(exc)}",
                          hint=f"check the NVIDIA driver (`nvidia-smi` must list the GPUs); {CPU_DEVICES_HINT}",
                          reason=NVML_FAILED) from None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if not gpus:
        raise ConfigError(f"no NVIDIA GPU found: NVML (driver {driver}) counts none",
                          hint=CPU_DEVICES_HINT, reason=NO_GPU)
    return Inventory(driver_version=driver, cuda_driver_version=cuda, nvml_version=version, gpus=tuple(gpus))


def _nvml_error(exc: Exception) -> str:
    """NVML's error as text: pynvml's own string asks the library, which may itself fail."""
    code = getattr(exc, "value", None)
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text or f"NVML error {code}"


def offer(devices: str | int, nvml: Nvml | None = None) -> tuple[int, tuple[Gpu, ...]]:
    """What ``--devices`` offers: a number N gives N CPU devices (no GPU); ``auto`` one device per NVIDIA GPU,
    or a ConfigError saying why there is none (a node never falls back to CPU devices unasked)."""
    if devices != "auto":
        return int(devices), ()
    try:
        inventory = discover(nvml)
    except ConfigError as exc:
        raise ConfigError(f"--devices auto: {exc.message}", hint=exc.hint, **exc.fields) from None
    return len(inventory.gpus), inventory.gpus


def process_memory(nvml: Nvml | None = None) -> dict[int, int | None]:
    """GPU memory each process holds now, as NVML counts it (its CUDA context and all it allocated, a caching
    allocator's reserve included), summed over this machine's GPUs: pid → bytes, None where the driver does
    not say (``usedGpuMemory`` unavailable, as under MIG or some virtualised GPUs). A process that uses no GPU
    is not listed.

    Called with every progress report: it never raises, and any NVML failure (no module, no driver, an
    error of the listing) gives an empty answer, for the figure to be left out rather than the report lost."""
    try:
        nvml = nvml if nvml is not None else load_nvml()
    except ConfigError:
        return {}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return {}
    out: dict[int, int | None] = {}
    try:
        for i in range(int(nvml.nvmlDeviceGetCount())):
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(i)):
                pid, used = int(proc.pid), proc.usedGpuMemory
                before = out.get(pid, 0)
                # Unknown on one GPU: unknown in all (a partial sum would pass for the whole).
                out[pid] = None if used is None or before is None else before + int(used)
    except nvml.NVMLError:
        return {}
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return out


def rank_env(device: int, gpus: Sequence[Gpu]) -> dict[str, str]:
    """The variables that give a rank placed on ``device`` its device: on a GPU node
    ``CUDA_VISIBLE_DEVICES`` = the device's GPU (its UUID), the same for every rank spliced onto it; on a node
    of CPU devices (``gpus`` empty) nothing."""
    if not gpus:
        return {}
    if not 0 <= device < len(gpus):
        raise MechanismError(f"device {device} does not exist on this node: it offers {len(gpus)} GPU(s), "
                             f"devices 0 to {len(gpus) - 1}", device=device,
                             hint="the control plane placed a rank on a device the node did not register: "
                                  "restart the agent so that it registers its devices again")
    return {"CUDA_VISIBLE_DEVICES": gpus[device].uuid}
