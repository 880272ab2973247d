"""Whether ranks fit in the memory of the GPUs a placement puts them on (pure)."""

from __future__ import annotations

from tidal.core import DeviceRef
from tidal.policy import gpufit
from tidal.policy.gpufit import GpuMemory, Misfit

GIB = 1 << 30
H100 = GpuMemory("NVIDIA H100 80GB HBM3", 80 * GIB)
A100 = GpuMemory("NVIDIA A100-SXM4-40GB", 40 * GIB)
N1 = [DeviceRef("n1", 0), DeviceRef("n1", 1)]
N2 = [DeviceRef("n2", 0), DeviceRef("n2", 1)]
GPUS = {d: H100 for d in N1} | {d: A100 for d in N2}


def test_ranks_that_fit_together_on_each_gpu() -> None:
    two_per_gpu = [N1[0], N1[0], N1[1], N1[1]]
    assert gpufit.misfits(two_per_gpu, 40 * GIB, GPUS) == []  # 80 GiB needed on each 80 GiB GPU: it fits
    assert gpufit.misfits(N1, 80 * GIB, GPUS) == []


def test_ranks_that_do_not_fit_are_counted_per_gpu_in_placement_order() -> None:
    placement = [N1[1], N1[1], N1[1], N1[0]]  # 3 ranks on GPU 1, one on GPU 0
    assert gpufit.misfits(placement, 30 * GIB, GPUS) == [
        Misfit("n1", 1, "NVIDIA H100 80GB HBM3", 80 * GIB, ranks=3, rank_bytes=30 * GIB)]
    assert gpufit.misfits(placement, 30 * GIB, GPUS)[0].needed_bytes == 90 * GIB
    both = [N1[0], N1[0], N1[1], N1[1]]
    assert [(m.node, m.device, m.ranks) for m in gpufit.misfits(both, 41 * GIB, GPUS)] == [("n1", 0, 2), ("n1", 1, 2)]


def test_mixed_nodes_each_gpu_against_its_own_memory() -> None:
    placement = [N1[0], N1[0], N2[0], N2[0]]  # 2 ranks on an H100 (fits), 2 on an A100 (does not)
    assert gpufit.misfits(placement, 25 * GIB, GPUS) == [
        Misfit("n2", 0, "NVIDIA A100-SXM4-40GB", 40 * GIB, ranks=2, rank_bytes=25 * GIB)]
    # A rank alone is held to its GPU too: one that ran in 50 GiB of an H100 does not fit an A100.
    assert gpufit.misfits([N1[0], N2[1]], 50 * GIB, GPUS) == [
        Misfit("n2", 1, "NVIDIA A100-SXM4-40GB", 40 * GIB, ranks=1, rank_bytes=50 * GIB)]


def test_cpu_devices_and_unmeasured_jobs_have_nothing_to_check() -> None:
    cpu = [DeviceRef("cpu-1", 0)] * 4
    assert gpufit.misfits(cpu, 100 * GIB, GPUS) == []  # no GPU on those devices
    assert gpufit.misfits([N2[0]] * 4, None, GPUS) == []  # never measured
    assert gpufit.misfits([N2[0]] * 4, 0, GPUS) == []
    assert gpufit.misfits([N2[0], N2[0], *cpu], 30 * GIB, GPUS) == [
        Misfit("n2", 0, "NVIDIA A100-SXM4-40GB", 40 * GIB, ranks=2, rank_bytes=30 * GIB)]


def test_the_fewest_devices_on_which_the_ranks_fit() -> None:
    assert gpufit.ranks_per_gpu(30 * GIB, 80 * GIB) == 2
    assert gpufit.fewest_devices(4, 30 * GIB, 80 * GIB) == 2
    assert gpufit.fewest_devices(5, 30 * GIB, 80 * GIB) == 3  # 2, 2 and 1 rank
    assert gpufit.fewest_devices(4, 20 * GIB, 80 * GIB) == 1
    assert gpufit.fewest_devices(4, 90 * GIB, 80 * GIB) is None  # one rank alone does not fit


def test_the_refusal_says_the_numbers() -> None:
    h100 = {N1[0]: GpuMemory("NVIDIA H100 80GB HBM3", 85520809984)}  # 79.6 GiB, as NVML counts an H100's
    assert gpufit.misfits([N1[0]] * 2, 39 * GIB, h100) == []
    found = gpufit.misfits([N1[0]] * 3, 30 * GIB, h100)
    assert gpufit.describe("j1", 1, found) == (
        "job j1 cannot run on 1 device: its ranks use up to 30.0 GiB of GPU memory each, and 3 of them on node "
        "n1's GPU 0 (NVIDIA H100 80GB HBM3, 79.6 GiB) need 90.0 GiB")
    found = gpufit.misfits([N2[0], N2[0], N2[1], N2[1]], 25 * GIB, GPUS)
    assert gpufit.describe("j2", 2, found) == (
        "job j2 cannot run on 2 devices: its ranks use up to 25.0 GiB of GPU memory each, and 2 of them on node "
        "n2's GPU 0 (NVIDIA A100-SXM4-40GB, 40.0 GiB) need 50.0 GiB (and likewise on 1 other GPU(s))")
    found = gpufit.misfits([N2[0]], 50 * GIB, GPUS)
    assert gpufit.describe("j3", 1, found) == (
        "job j3 cannot run on 1 device: its ranks use up to 50.0 GiB of GPU memory each, and 1 of them on node "
        "n2's GPU 0 (NVIDIA A100-SXM4-40GB, 40.0 GiB) needs 50.0 GiB")
