"""``tidal doctor``'s GPU rows against a fake NVML, a fake libcuda and a fake torch probe: logic only (no GPU,
no driver, no CUDA torch here). Every row is asserted whole: status, detail and fix."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.agent.test_gpus import GIB, H100, TWO_H100, UUID0, FakeNvml
from tidal.agent import gpuchecks
from tidal.agent.gpuchecks import CHECKPOINT_API, NO_GPU_ROW, CtypesCuda, gpu_rows
from tidal.cli import doctor
from tidal.control import checks as control_checks
from tidal.errors import ConfigError, MechanismError
from tidal.mechanisms import checks
from tidal.mechanisms.checks import Check, Planned

NCCL_OK = {"torch": "2.11.0+cu130", "cuda": "13.0", "available": True, "nccl": "2.28.3"}
INSTALL_NVML = "pip install 'tidal[gpu]' (nvidia-ml-py) in Tidal's environment"
UPGRADE = "upgrade the NVIDIA driver to 570 or later (it brings the CUDA driver's checkpoint API)"


class FakeCuda:
    """libcuda.so.1 as the rows see it: its driver version and the symbols it exports."""

    def __init__(self, version: int = 13000, exports: tuple[str, ...] = CHECKPOINT_API) -> None:
        self.version, self.names = version, exports

    def driver_version(self) -> int:
        return self.version

    def exports(self, name: str) -> bool:
        return name in self.names


def _nvml(nvml: FakeNvml) -> Callable[[], FakeNvml]:
    return lambda: nvml


def _no_module() -> Any:
    raise ConfigError("no module", reason="no-nvml-module")


def _no_libcuda() -> Any:
    raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")


def _never() -> Any:
    raise AssertionError("not to be asked on a machine without a GPU")


def rows(**kw: Any) -> dict[str, Check]:
    got = gpu_rows(**kw)
    assert tuple(r.name for r in got) == gpuchecks.ROWS
    assert not any(r.required or r.failed for r in got)  # never required: CPU jobs run without them
    return {r.name: r for r in got}


def test_a_machine_without_a_gpu_says_so_in_every_row_and_fails_none() -> None:
    """Fake NVML: logic only. No pynvml and no GPU listed by the kernel, NVML without a driver, NVML counting
    no GPU: the same rows, all ok."""
    expected = {name: Check(name, "ok", NO_GPU_ROW) for name in gpuchecks.ROWS}
    assert rows(nvml=_no_module, libcuda=_never, torch=_never, present=lambda: False) == expected
    assert rows(nvml=_nvml(FakeNvml([], init_error=12)), libcuda=_never, torch=_never) == expected
    assert rows(nvml=_nvml(FakeNvml([], init_error=9)), libcuda=_never, torch=_never) == expected
    assert rows(nvml=_nvml(FakeNvml([])), libcuda=_never, torch=_never) == expected


def test_a_ready_gpu_machine() -> None:
    """Fake NVML, fake libcuda, fake torch: logic only."""
    got = rows(nvml=_nvml(FakeNvml(TWO_H100)), libcuda=FakeCuda, torch=lambda: NCCL_OK)
    assert got == {
        "gpus": Check("gpus", "ok", f"2 GPU(s): GPU 0: {H100}, 80.0 GiB (0.5 GiB in use); "
                                    f"GPU 1: {H100}, 80.0 GiB (0.0 GiB in use)"),
        "nvml": Check("nvml", "ok", "NVML 13.580.159.04"),
        "nvidia driver": Check("nvidia driver", "ok", "580.159.04"),
        "cuda driver": Check("cuda driver", "ok", "13.0 (cuDriverGetVersion: 13000)"),
        "cuda checkpoint api": Check("cuda checkpoint api", "ok", "libcuda.so.1 exports cuCheckpointProcessLock, "
                                     "cuCheckpointProcessCheckpoint, cuCheckpointProcessRestore, "
                                     "cuCheckpointProcessUnlock, cuCheckpointProcessGetState"),
        "nccl": Check("nccl", "ok", "2.28.3 (torch 2.11.0+cu130, CUDA 13.0)"),
    }


def test_an_old_driver_without_the_checkpoint_api() -> None:
    """Fake NVML, fake libcuda: logic only."""
    old = FakeNvml([(UUID0, H100, 80 * GIB, 0)], driver=b"550.54.15", cuda=12040)
    got = rows(nvml=_nvml(old), libcuda=lambda: FakeCuda(12040, exports=("cuCheckpointProcessGetState",)),
               torch=lambda: NCCL_OK)
    assert got["nvidia driver"] == Check("nvidia driver", "warn", "550.54.15: older than 570, the first with the "
                                         "CUDA driver's checkpoint API", UPGRADE)
    assert got["cuda driver"] == Check("cuda driver", "ok", "12.4 (cuDriverGetVersion: 12040)")
    assert got["cuda checkpoint api"] == Check(
        "cuda checkpoint api", "warn", "libcuda.so.1 lacks cuCheckpointProcessLock, cuCheckpointProcessCheckpoint, "
        "cuCheckpointProcessRestore, cuCheckpointProcessUnlock: GPU jobs cannot be checkpointed", UPGRADE)


def test_gpus_the_kernel_lists_without_the_nvml_module_or_libcuda() -> None:
    """Fake probes: logic only."""
    got = rows(nvml=_no_module, libcuda=_no_libcuda, torch=lambda: None, present=lambda: True)
    why = "libcuda.so.1 cannot be loaded: libcuda.so.1: cannot open shared object file: No such file or directory"
    fix = "install the NVIDIA driver's CUDA library (libcuda.so.1) where Tidal's agent runs"
    assert got == {
        "gpus": Check("gpus", "warn", "the NVIDIA driver lists GPUs (/proc/driver/nvidia/gpus), but they cannot be "
                                      "offered: nvidia-ml-py is not installed", INSTALL_NVML),
        "nvml": Check("nvml", "warn", "nvidia-ml-py (pynvml) is not installed", INSTALL_NVML),
        "nvidia driver": Check("nvidia driver", "warn", "unknown: NVML is needed to read it", INSTALL_NVML),
        "cuda driver": Check("cuda driver", "warn", why, fix),
        "cuda checkpoint api": Check("cuda checkpoint api", "warn", why, fix),
        "nccl": Check("nccl", "warn", f"torch is not installed in {sys.executable}: no NCCL to check",
                      "pip install 'tidal[torch]' (a CUDA build of torch) in the jobs' environment"),
    }


def test_nvml_failing_is_a_warning_with_its_reason() -> None:
    """Fake NVML: logic only."""
    got = rows(nvml=_nvml(FakeNvml(TWO_H100, list_error=15)), libcuda=FakeCuda, torch=lambda: NCCL_OK)
    hint = ("check the NVIDIA driver (`nvidia-smi` must list the GPUs); give --devices N to offer N CPU devices "
            "instead")
    assert got["gpus"] == Check("gpus", "warn", "NVML failed listing the GPUs: NVML error 15", hint)
    assert got["nvidia driver"] == Check("nvidia driver", "warn", "unknown: NVML failed", hint)
    assert got["cuda driver"].status == "ok" and got["nccl"].status == "ok"


@pytest.mark.parametrize(("probe", "expected"), [
    ({"torch": "2.13.0+cpu", "cuda": None, "available": False, "nccl": None},
     Check("nccl", "warn", "torch 2.13.0+cpu is built without CUDA",
           "install a CUDA build of torch in the jobs' environment")),
    ({"torch": "2.11.0+cu130", "cuda": "13.0", "available": False, "nccl": None},
     Check("nccl", "warn", "torch 2.11.0+cu130 (CUDA 13.0) cannot use the GPUs: torch.cuda.is_available() is false",
           "install a torch whose CUDA the driver supports (`tidal doctor`: cuda driver)")),
    ({"torch": "2.11.0+cu130", "cuda": "13.0", "available": True, "nccl": None},
     Check("nccl", "warn", "torch 2.11.0+cu130 (CUDA 13.0) has no NCCL",
           "install a torch built with NCCL (the CUDA wheels are)")),
    ({"torch": "1.13.1", "cuda": "11.7", "available": True, "nccl": 21408},
     Check("nccl", "ok", "2.14.8 (torch 1.13.1, CUDA 11.7)")),
    ({"error": "ImportError: libcudart.so.13: cannot open shared object file"},
     Check("nccl", "warn", "could not ask torch: ImportError: libcudart.so.13: cannot open shared object file",
           "check that `python -c 'import torch'` works in the jobs' environment")),
])
def test_the_nccl_row(probe: dict[str, Any], expected: Check) -> None:
    """Fake NVML and torch probe: logic only."""
    assert rows(nvml=_nvml(FakeNvml(TWO_H100)), libcuda=FakeCuda, torch=lambda: probe)["nccl"] == expected


def test_nccl_version_codes() -> None:
    assert gpuchecks.nccl_text(22803) == "2.28.3"
    assert gpuchecks.nccl_text(2708) == "2.7.8"
    assert gpuchecks.nccl_text("2.28.3") == "2.28.3"


def test_libcuda_through_ctypes() -> None:
    """A fake library object in place of libcuda.so.1: the ctypes calling convention only."""
    class Lib:
        def cuDriverGetVersion(self, ref: Any) -> int:
            ref._obj.value = 13000
            return 0

        cuCheckpointProcessLock = object()

    cuda = CtypesCuda(Lib())
    assert cuda.driver_version() == 13000
    assert cuda.exports("cuCheckpointProcessLock") and not cuda.exports("cuCheckpointProcessRestore")

    class Failing:
        def cuDriverGetVersion(self, ref: Any) -> int:
            return 3  # CUDA_ERROR_NOT_INITIALIZED

    with pytest.raises(MechanismError) as e:
        CtypesCuda(Failing()).driver_version()
    assert e.value.message == "cuDriverGetVersion returned CUDA error 3"
    got = rows(nvml=_nvml(FakeNvml(TWO_H100)), libcuda=lambda: CtypesCuda(Failing()), torch=lambda: NCCL_OK)
    assert got["cuda driver"] == Check("cuda driver", "warn", "cuDriverGetVersion returned CUDA error 3",
                                       "check the NVIDIA driver (`nvidia-smi` must run)")


def test_no_nvidia_gpu_listed_by_the_kernel(tmp_path: Any) -> None:
    assert not gpuchecks.nvidia_gpus_present(str(tmp_path / "none"))
    assert not gpuchecks.nvidia_gpus_present(str(tmp_path))
    (tmp_path / "0000:18:00.0").mkdir()
    assert gpuchecks.nvidia_gpus_present(str(tmp_path))


def test_doctor_shows_the_gpu_rows_after_the_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake checks: the order of the doctor's rows only."""
    def one(name: str) -> list[Planned]:
        return [Planned(name, False, lambda: Check(name, "ok", "x"))]

    monkeypatch.setattr(checks, "machine_checks", lambda: one("kernel"))
    monkeypatch.setattr(control_checks, "control_plane_checks", lambda: one("TIDAL_HOME"))
    monkeypatch.setattr(gpuchecks, "planned", lambda: one("gpus"))
    assert [c.name for c in doctor.run_checks()] == ["kernel", "gpus", "TIDAL_HOME"]
