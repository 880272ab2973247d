"""CUDA jobs under real CRIU and the real driver's checkpoint API: an unmodified CUDA training script is
checkpointed (going on, and killed) and restored on another node root, its output and parameters
byte-identical to an uninterrupted run; NCCL DDP through the interposer is cut, checkpointed and restored;
two ranks sharing one GPU (gloo over CUDA tensors) are identical to ``torchrun``. Tests that need two GPUs
say so where there is one."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.integration.mechanisms.interpose.test_interpose import StartRef, log, prefix, rank_specs
from tests.integration.ranks import EXAMPLES, Cluster, reference_run
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import RankSpec
from tidal.mechanisms.interpose.channel import Store
from tidal.mechanisms.interpose.storeserver import RendezvousServer
from tidal.testing import wait_for_line

pytestmark = [pytest.mark.gpu, pytest.mark.criu, pytest.mark.torch]

CUDA = EXAMPLES / "train_cuda.py"
# Enough steps that the script still runs when the second checkpoint comes (after step 30): on an H100, 60
# steps were over before it.
STEPS = "200"


def on_gpu(spec: RankSpec, gpu: str) -> RankSpec:
    return RankSpec(spec.job_id, spec.rank, spec.argv, spec.workdir, {**spec.env, "CUDA_VISIBLE_DEVICES": gpu})


def cuda_argv(*extra: str) -> list[str]:
    return [sys.executable, str(CUDA), "--steps", STEPS, "--step-time", "0.04", *extra]


def test_cuda_script_checkpointed_going_on_then_killed_and_restored_is_identical(cluster: Cluster,
                                                                                 gpus: list[str]) -> None:
    argv = cuda_argv("--gpu-mb", "512")
    spec = on_gpu(cluster.spec(argv), "0")
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    nodes = cluster.nodes
    job = Job.launch("job", [(spec, nodes[0])], cluster.store)
    path = nodes[0].log_path(spec)
    wait_for_line(path, r"^rank 0 step 15 ", timeout=120)
    pid = job.ranks[0].pid
    job.checkpoint(then="continue")
    assert job.ranks[0].running and job.ranks[0].pid == pid
    wait_for_line(path, r"^rank 0 step 30 ", timeout=120)
    info = job.checkpoint(then="kill")
    assert job.ranks[0].wait(30).signal == signal.SIGKILL
    assert cluster.store.reader("job", info.id).meta["ranks"]["0"]["gpus"] == [gpus[0]]
    job = Job.restore(cluster.store, "job", [(spec, nodes[1])])
    assert [s.code for s in job.wait(300)] == [0]
    out = nodes[1].log_path(spec).read_bytes()
    assert out == ref
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()
    assert out.count(b"rank 0 ballast ") == 2


def test_restored_onto_another_gpu_index(cluster: Cluster, gpus: list[str]) -> None:
    if len(gpus) < 2:
        pytest.skip(f"one GPU here ({gpus[0]}): moving a rank to another GPU index needs two")
    argv = cuda_argv("--gpu-mb", "256")
    spec = on_gpu(cluster.spec(argv), "0")
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^rank 0 step 20 ", timeout=120)
    job.checkpoint(then="kill")
    moved = on_gpu(spec, "1")
    job = Job.restore(cluster.store, "job", [(moved, cluster.nodes[1])])
    assert [s.code for s in job.wait(300)] == [0]
    assert cluster.nodes[1].log_path(moved).read_bytes() == ref


def _ddp(cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef, world: int, backend: str,
         gpu_of: list[str]) -> None:
    argv = [str(CUDA), "--steps", STEPS, "--step-time", "0.04", "--backend", backend, "--gpu-mb", "128"]
    ref = torchrun(argv, world)
    pre = prefix()
    specs = [on_gpu(s, gpu_of[s.rank]) for s in rank_specs(cluster, [sys.executable, *argv], world,
                                                          rendezvous.addr, f"{pre}/1")]
    nodes = cluster.nodes
    job = Job.launch("job", [(s, nodes[0]) for s in specs], cluster.store)
    wait_for_line(log(job, 0), r"^rank 0 step 15 ", timeout=120)
    job.checkpoint(then="continue")  # NCCL dropped at the cut, GPU state out and back, NCCL rebuilt
    assert job.last_cut is not None and all(r.running for r in job.ranks)
    wait_for_line(log(job, 0), r"^rank 0 step 30 ", timeout=120)
    job.checkpoint(then="kill")
    assert [r.wait(30).signal for r in job.ranks] == [signal.SIGKILL] * world
    job = Job.restore(cluster.store, "job", [(s, nodes[1]) for s in specs],
                      rendezvous=Store(rendezvous.addr, f"{pre}/2"))
    assert [s.code for s in job.wait(300)] == [0] * world
    for r in range(world):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"
    assert (cluster.workdir / "params.bin").read_bytes() == ref.params


def test_nccl_job_cut_checkpointed_and_restored_is_identical_to_torchrun(
        cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef, gpus: list[str]) -> None:
    """One NCCL rank per GPU here: as many ranks as GPUs, at most 2 (NCCL refuses two ranks on one GPU)."""
    world = min(2, len(gpus))
    _ddp(cluster, rendezvous, torchrun, world, "nccl", [str(i) for i in range(world)])


def test_two_ranks_spliced_on_one_gpu_are_identical_to_torchrun(
        cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef, gpus: list[str]) -> None:
    """Both ranks on GPU 0 (gloo carries the CUDA tensors), against ``torchrun`` whose ranks take GPU
    ``LOCAL_RANK`` modulo the GPUs: the same GPU where there is one."""
    _ddp(cluster, rendezvous, torchrun, 2, "gloo", ["0", "0"])


def test_cuda_script_restored_from_the_images_dumped_on_its_node_is_identical(cluster: Cluster,
                                                                                gpus: list[str]) -> None:
    """A resize's fast path on a GPU rank: dumped (GPU state included) and killed, restored at once from the
    images on this machine while they are committed, nothing fetched; the run identical, the checkpoint
    committed."""
    argv = cuda_argv("--gpu-mb", "256")
    spec = on_gpu(cluster.spec(argv), "0")
    ref = reference_run(argv, cluster.root / "ref", spec.launch_env())
    node = cluster.nodes[0]
    job = Job.launch("job", [(spec, node)], cluster.store)
    wait_for_line(node.log_path(spec), r"^rank 0 step 20 ", timeout=120)
    local = job.checkpoint_local()
    job = Job.restore(cluster.store, "job", [(spec, node)], local=local)
    rt = job.restore_timing
    assert rt is not None and rt.fetched_bytes == 0 and rt.image_bytes > 0
    info = local.wait(120)
    assert cluster.store.latest("job").id == info.id  # type: ignore[union-attr]
    assert cluster.store.reader("job", info.id).meta["ranks"]["0"]["gpus"] == [gpus[0]]
    assert [s.code for s in job.wait(300)] == [0]
    assert node.log_path(spec).read_bytes() == ref
    assert (cluster.workdir / "params.bin").read_bytes() == (cluster.root / "ref" / "params.bin").read_bytes()
