"""GPU devices on the agent's side, against a fake NVML: logic only (no GPU, no driver, no pynvml here).

What NVML's answers become (the GPUs, or an error that says what to do), what ``--devices`` offers, and the
environment that gives each rank its GPU: ``CUDA_VISIBLE_DEVICES`` = the UUID of its device's GPU, the same
for the ranks spliced onto one device, none on CPU devices; and the GPU memory of each job's largest rank,
which the progress reports carry. Whether real NVML and CUDA behave as the fake does is for a GPU machine to
show."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidal.agent import gpus
from tidal.agent.executor import Executor, Running
from tidal.agent.gpus import Gpu
from tidal.agent.main import Agent, main
from tidal.core import protocol
from tidal.core.topology import devices_option
from tidal.errors import ConfigError, MechanismError, ValidationError

GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
UUID0 = "GPU-0f4c2c1e-6a1b-4d2e-9b7a-2f3c4d5e6f70"
UUID1 = "GPU-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"


class FakeNvmlError(Exception):
    """As pynvml's NVMLError: the return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """A fake NVML (pynvml's functions and error class) answering for ``devices`` GPUs; ``processes``: the
    compute processes on each GPU, by index, as (pid, bytes used or None where the driver does not say);
    ``init_error`` / ``list_error`` / ``process_error``: the code nvmlInit / the device listing / the process
    listing fails with. It records its calls."""

    NVMLError = FakeNvmlError

    def __init__(self, devices: list[tuple[str, str, int, int]], init_error: int | None = None,
                 list_error: int | None = None, driver: str | bytes = "580.159.04", cuda: int = 13000,
                 processes: dict[int, list[tuple[int, int | None]]] | None = None,
                 process_error: int | None = None) -> None:
        self.devices, self.init_error, self.list_error = devices, init_error, list_error
        self.driver, self.cuda = driver, cuda
        self.processes, self.process_error = processes or {}, process_error
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        if self.list_error is not None:
            raise FakeNvmlError(self.list_error)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("handle", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self.devices[handle[1]][0]

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        return self.devices[handle[1]][1].encode()  # older pynvml answers bytes

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        _, _, total, used = self.devices[handle[1]]
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if self.process_error is not None:
            raise FakeNvmlError(self.process_error)
        # As pynvml's process info: usedGpuMemory is None where NVML answers "not available".
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes.get(handle[1], [])]


TWO_H100 = [(UUID0, H100, 80 * GIB, GIB // 2), (UUID1, H100, 80 * GIB, 0)]


def test_discover_lists_every_gpu_in_nvml_order_and_shuts_nvml_down() -> None:
    """Fake NVML: logic only."""
    nvml = FakeNvml(TWO_H100)
    inv = gpus.discover(nvml)
    assert inv == gpus.Inventory(driver_version="580.159.04", cuda_driver_version=13000,
                                 nvml_version="13.580.159.04",
                                 gpus=(Gpu(0, UUID0, H100, 80 * GIB, GIB // 2), Gpu(1, UUID1, H100, 80 * GIB, 0)))
    assert nvml.calls == ["init", "shutdown"]
    assert gpus.cuda_version_text(inv.cuda_driver_version) == "13.0"
    assert gpus.cuda_version_text(12080) == "12.8"


@pytest.mark.parametrize(("code", "what"), [
    (12, "no NVIDIA GPU found: NVML's library (libnvidia-ml.so.1) is not installed"),
    (9, "no NVIDIA GPU found: the NVIDIA driver's kernel module is not loaded"),
])
def test_no_driver_is_a_config_error_that_says_to_give_cpu_devices(code: int, what: str) -> None:
    """Fake NVML: logic only."""
    with pytest.raises(ConfigError) as e:
        gpus.discover(FakeNvml([], init_error=code))
    assert e.value.message == what
    assert e.value.hint == "give --devices N to offer N CPU devices instead, or install the NVIDIA driver"
    assert e.value.fields == {"reason": gpus.NO_DRIVER}


def test_no_gpu_and_other_nvml_failures() -> None:
    """Fake NVML: logic only."""
    nvml = FakeNvml([])
    with pytest.raises(ConfigError) as e:
        gpus.discover(nvml)
    assert e.value.message == "no NVIDIA GPU found: NVML (driver 580.159.04) counts none"
    assert e.value.hint == "give --devices N to offer N CPU devices instead"
    assert e.value.fields == {"reason": gpus.NO_GPU}
    assert nvml.calls == ["init", "shutdown"]

    broken = FakeNvml(TWO_H100, list_error=15)  # NVML_ERROR_GPU_IS_LOST
    with pytest.raises(ConfigError) as e:
        gpus.discover(broken)
    assert e.value.message == "NVML failed listing the GPUs: NVML error 15"
    assert e.value.hint == ("check the NVIDIA driver (`nvidia-smi` must list the GPUs); give --devices N to offer N "
                            "CPU devices instead")
    assert e.value.fields == {"reason": gpus.NVML_FAILED}
    assert broken.calls == ["init", "shutdown"]  # shut down after a failure too

    with pytest.raises(ConfigError) as e:
        gpus.discover(FakeNvml([], init_error=4))  # NVML_ERROR_NO_PERMISSION
    assert e.value.message == "NVML failed to start: NVML error 4"


def test_a_missing_nvml_module_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logic only: the import of pynvml is made to fail, as where nvidia-ml-py is not installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with pytest.raises(ConfigError) as e:
        gpus.load_nvml()
    assert e.value.message == ("the NVML Python module (nvidia-ml-py, imported as pynvml) is not installed, so this "
                               "machine's NVIDIA GPUs cannot be listed")
    assert e.value.hint == ("pip install 'tidal[gpu]' (or nvidia-ml-py) in Tidal's environment; give --devices N to "
                            "offer N CPU devices instead")
    assert e.value.fields == {"reason": gpus.NO_MODULE}
    with pytest.raises(ConfigError) as e:
        gpus.offer("auto")  # the real loader: the same error, as --devices auto's
    assert e.value.message.startswith("--devices auto: the NVML Python module (nvidia-ml-py")


def test_devices_auto_offers_one_device_per_gpu_and_a_number_offers_cpu_devices() -> None:
    """Fake NVML: logic only."""
    assert gpus.offer("auto", FakeNvml(TWO_H100)) == (2, (Gpu(0, UUID0, H100, 80 * GIB, GIB // 2),
                                                          Gpu(1, UUID1, H100, 80 * GIB, 0)))
    nvml = FakeNvml(TWO_H100)
    assert gpus.offer(3, nvml) == (3, ())
    assert nvml.calls == []  # a number never asks NVML
    with pytest.raises(ConfigError) as e:
        gpus.offer("auto", FakeNvml([], init_error=12))
    assert e.value.message == ("--devices auto: no NVIDIA GPU found: NVML's library (libnvidia-ml.so.1) is not "
                               "installed")
    assert e.value.hint == "give --devices N to offer N CPU devices instead, or install the NVIDIA driver"


def test_the_devices_argument() -> None:
    assert devices_option("auto") == "auto"
    assert devices_option("4") == 4
    for text, message in (("gpu", "--devices 'gpu': give a number of CPU devices, or auto (one device per NVIDIA GPU)"),
                          ("0", "--devices 0: a node offers from 1 to 256 devices")):
        with pytest.raises(ValidationError) as e:
            devices_option(text)
        assert e.value.message == message and e.value.fields == {"field": "devices"}


def test_the_agent_refuses_a_bad_devices_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--name", "n1", "--server", "http://127.0.0.1:1", "--root", "/nonexistent", "--devices", "gpu"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tidal-agent: error: --devices 'gpu': give a number of CPU devices, or auto (one device per NVIDIA GPU)")


GPUS = (Gpu(0, UUID0, H100, 80 * GIB, 0), Gpu(1, UUID1, H100, 80 * GIB, 0))


def test_a_rank_sees_the_gpu_of_its_device_by_uuid() -> None:
    """Logic only."""
    assert gpus.rank_env(0, GPUS) == {"CUDA_VISIBLE_DEVICES": UUID0}
    assert gpus.rank_env(1, GPUS) == {"CUDA_VISIBLE_DEVICES": UUID1}
    assert gpus.rank_env(0, ()) == {}  # CPU devices: no CUDA variable
    with pytest.raises(MechanismError) as e:
        gpus.rank_env(2, GPUS)
    assert e.value.message == "device 2 does not exist on this node: it offers 2 GPU(s), devices 0 to 1"


class FakeClient:
    node = "node-1"


def _launch(devices: list[int], env: dict[str, str] | None = None) -> protocol.Launch:
    return protocol.Launch(job_id="j1", attempt=1, argv=["python", "train.py"], workdir="/w", env=env or {},
                           world_size=len(devices), local_world_size=len(devices), group_rank=0, group_world_size=1,
                           ranks=[protocol.RankSlot(rank=r, local_rank=r, device=d) for r, d in enumerate(devices)],
                           torchrun=True)


def _executor(gpu_list: tuple[Gpu, ...]) -> Executor:
    # No node root nor store: only the ranks' specifications are made, nothing runs.
    return Executor(FakeClient(), SimpleNamespace(), SimpleNamespace(), "A1", lambda _: None,  # type: ignore[arg-type]
                    gpus=gpu_list)


def test_ranks_spliced_onto_one_gpu_share_its_uuid() -> None:
    """Logic only: 4 ranks on 2 GPU devices (D < W: two ranks a device) get their device's GPU; the
    submitter's own CUDA_VISIBLE_DEVICES is replaced."""
    specs = _executor(GPUS)._specs(_launch([0, 0, 1, 1], env={"CUDA_VISIBLE_DEVICES": "3", "HOME": "/h"}))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == [UUID0, UUID0, UUID1, UUID1]
    assert [s.env["LOCAL_RANK"] for s in specs] == ["0", "1", "2", "3"]  # torchrun's, unchanged
    assert all(s.env["HOME"] == "/h" for s in specs)


def test_ranks_on_cpu_devices_get_no_cuda_variable() -> None:
    """Logic only: a CPU node's ranks see what they saw before GPU devices existed (the submitter's
    environment passes through, a CUDA_VISIBLE_DEVICES in it included)."""
    specs = _executor(())._specs(_launch([0, 1]))
    assert all("CUDA_VISIBLE_DEVICES" not in s.env for s in specs)
    (spec,) = _executor(())._specs(_launch([0], env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "1"


def _agent(devices: int | str, nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Agent:
    """An agent as far as its registration: its devices and what it registers (no control plane is reached)."""
    real_offer = gpus.offer
    monkeypatch.setattr("tidal.agent.main.offer", lambda d: real_offer(d, nvml))
    monkeypatch.setattr(Agent, "credential", lambda self: ("token", "file"))
    args = argparse.Namespace(name="gpu-1", server="http://127.0.0.1:1", root=str(tmp_path), ca=None,
                              ca_fingerprint=None, devices=devices, region="local", cluster="local",
                              advertise_addr=None, token_file=None, join_token=None)
    return Agent(args)


def test_a_gpu_node_registers_each_devices_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake NVML: logic only."""
    hello = _agent("auto", FakeNvml(TWO_H100), monkeypatch, tmp_path).hello()
    assert hello.devices == 2 and len(hello.cpus) == 2
    assert hello.gpus == [protocol.GpuDevice(index=0, uuid=UUID0, model=H100, memory_bytes=80 * GIB),
                          protocol.GpuDevice(index=1, uuid=UUID1, model=H100, memory_bytes=80 * GIB)]


def test_a_cpu_node_registers_as_before(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake NVML: logic only (never asked for a number of devices)."""
    nvml = FakeNvml(TWO_H100)
    hello = _agent(1, nvml, monkeypatch, tmp_path).hello()
    assert hello.devices == 1 and hello.gpus is None
    assert "gpus" not in hello.model_fields_set
    assert nvml.calls == []


# -- the GPU memory of the ranks ------------------------------------------------------------------------------
def test_process_memory_sums_each_process_over_the_gpus() -> None:
    """Fake NVML: logic only. A process on two GPUs holds the sum; one the driver does not say the memory of
    (on any GPU) is None, not 0."""
    nvml = FakeNvml(TWO_H100, processes={0: [(100, 10 * GIB), (101, GIB), (102, None)],
                                         1: [(100, 2 * GIB), (102, 3 * GIB), (103, None)]})
    assert gpus.process_memory(nvml) == {100: 12 * GIB, 101: GIB, 102: None, 103: None}
    assert nvml.calls == ["init", "shutdown"]
    assert gpus.process_memory(FakeNvml(TWO_H100)) == {}  # no process on any GPU


def test_process_memory_is_empty_whatever_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake NVML: logic only. Progress reports must not fail for NVML: any failure gives nothing."""
    assert gpus.process_memory(FakeNvml(TWO_H100, init_error=9)) == {}
    broken = FakeNvml(TWO_H100, processes={0: [(100, GIB)]}, process_error=15)
    assert gpus.process_memory(broken) == {}
    assert broken.calls == ["init", "shutdown"]  # shut down after a failure too
    assert gpus.process_memory(FakeNvml(TWO_H100, list_error=15)) == {}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert gpus.process_memory() == {}


# No process has these ids (above Linux's largest pid_max): their CPU time and memory read as 0.
P = 1 << 23


def _running(executor: Executor, job_id: str, rank_pids: list[list[int]], attempt: int = 1) -> None:
    """A job running on ``executor`` as far as its progress report reads it: its ranks' processes."""
    ranks = [SimpleNamespace(pids=lambda ps=ps: ps) for ps in rank_pids]
    job = SimpleNamespace(ranks=ranks, channels=lambda: [])
    executor.jobs[job_id] = Running(job_id, attempt, job, specs=[])  # type: ignore[arg-type]


def test_progress_on_a_gpu_node_reports_the_largest_ranks_gpu_memory() -> None:
    """Fake NVML: logic only. Rank 0 is two processes (12 GiB together, over both GPUs), rank 1 one of 11 GiB:
    the job's figure is 12 GiB. Another job's processes and those of no job do not count; a job none of
    whose processes uses a GPU gets no figure. One NVML reading serves every job."""
    ex = _executor(GPUS)
    ex.nvml = nvml = FakeNvml(TWO_H100, processes={0: [(P, 10 * GIB), (P + 2, 11 * GIB), (P + 9, 70 * GIB)],
                                                   1: [(P + 1, 2 * GIB), (P + 3, 30 * GIB)]})
    _running(ex, "j1", [[P, P + 1], [P + 2]], attempt=2)
    _running(ex, "j2", [[P + 3]])
    _running(ex, "j3", [[P + 4], [P + 5]])
    out = ex.progress()
    assert out["j1"] == {"attempt": 2, "cpu_s": 0.0, "rss_bytes": 0, "output_bytes": 0, "gpu_rank_bytes": 12 * GIB}
    assert out["j2"]["gpu_rank_bytes"] == 30 * GIB
    assert "gpu_rank_bytes" not in out["j3"]
    assert nvml.calls == ["init", "shutdown"]


def test_progress_leaves_the_figure_out_when_it_cannot_be_told() -> None:
    """Fake NVML: logic only. The driver does not say what a process of the job holds (rank 1's, here), or
    NVML fails: no figure, rather than one too small; the rest of the report is made."""
    ex = _executor(GPUS)
    ex.nvml = FakeNvml(TWO_H100, processes={0: [(P, 10 * GIB)], 1: [(P + 1, None)]})
    _running(ex, "j1", [[P], [P + 1]])
    assert ex.progress()["j1"] == {"attempt": 1, "cpu_s": 0.0, "rss_bytes": 0, "output_bytes": 0}
    ex.nvml = FakeNvml(TWO_H100, processes={0: [(P, 10 * GIB)]}, process_error=15)
    assert ex.progress()["j1"] == {"attempt": 1, "cpu_s": 0.0, "rss_bytes": 0, "output_bytes": 0}


def test_progress_on_a_cpu_node_or_with_nothing_running_asks_nvml_nothing() -> None:
    """Fake NVML: logic only."""
    cpu = _executor(())
    cpu.nvml = nvml = FakeNvml(TWO_H100, processes={0: [(P, GIB)]})
    _running(cpu, "j1", [[P]])
    assert "gpu_rank_bytes" not in cpu.progress()["j1"]
    idle = _executor(GPUS)
    idle.nvml = nvml
    assert idle.progress() == {}
    assert nvml.calls == []
