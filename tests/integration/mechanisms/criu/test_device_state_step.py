"""The device-state step inside a real checkpoint of a real rank, with a fake driver that takes the rank's
process for a CUDA one (logic only: this machine has no GPU; tests/gpu runs the real driver). A failing
step leaves the rank running and no checkpoint behind; a working one is called in order around the dump,
its GPUs are recorded in the checkpoint, and a restore onto other GPUs remaps them."""

from __future__ import annotations

import pytest

from tests.integration.ranks import Cluster, train_argv
from tidal.errors import CheckpointError
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import RankSpec
from tidal.mechanisms.gpu.devicestate import DeviceState, device_fds
from tidal.mechanisms.gpu.driver import CHECKPOINTED
from tidal.testing import wait_for_line
from tidal.testing.cudadriver import U0, U1, FakeDriver

pytestmark = [pytest.mark.torch, pytest.mark.criu]


def fake_step(drv: FakeDriver, script_pids: set[int]) -> DeviceState:
    """The rank's Python process "holds /dev/nvidia0" until the fake driver checkpoints it."""
    def fds(pid: int) -> list[str]:
        return ["/dev/nvidia0"] if pid in script_pids and drv.states.get(pid) != CHECKPOINTED else device_fds(pid)
    return DeviceState(lambda: drv, lock_timeout=1.0, fds=fds)


def test_failed_device_step_leaves_the_job_running_and_no_checkpoint(cluster: Cluster) -> None:
    spec = cluster.spec(train_argv("--steps", "400", "--step-time", "0.02"))
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    log = cluster.nodes[0].log_path(spec)
    wait_for_line(log, r"^step 3 ")
    script = job.ranks[0].pids()[1]
    drv = FakeDriver(fail={("lock", script): "CUDA_ERROR_TIMEOUT"})
    job.devices = fake_step(drv, {script})
    with pytest.raises(CheckpointError, match="GPU state of rank job.r0 could not be checkpointed: "
                                              "cuCheckpointProcessLock .* CUDA_ERROR_TIMEOUT"):
        job.checkpoint(then="kill")
    assert drv.calls == [("lock", script, 1000)]
    assert job.ranks[0].running and cluster.store.list("job") == []
    steps = log.read_text().count("step ")
    wait_for_line(log, rf"^step {steps + 2} ")  # it goes on
    job.kill()


def test_device_step_wraps_the_dump_and_a_restore_remaps_the_gpu(cluster: Cluster) -> None:
    argv = train_argv("--steps", "400", "--step-time", "0.02")
    base = cluster.spec(argv)
    spec = RankSpec(base.job_id, 0, base.argv, base.workdir, {**base.env, "CUDA_VISIBLE_DEVICES": "0"})
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^step 3 ")
    script = job.ranks[0].pids()[1]
    drv = FakeDriver()
    job.devices = fake_step(drv, {script})
    info = job.checkpoint(then="continue")
    assert drv.calls == [("lock", script, 1000), ("checkpoint", script), ("restore", script, None),
                         ("unlock", script)]
    assert job.ranks[0].running
    assert cluster.store.reader("job", info.id).meta["ranks"]["0"]["gpus"] == [U0]
    job.kill()
    # Restored onto GPU 1: every restored process the driver says waits with GPU state is remapped.
    moved = RankSpec(spec.job_id, 0, spec.argv, spec.workdir, {**spec.env, "CUDA_VISIBLE_DEVICES": "1"})
    restored_drv = FakeDriver()

    class Waiting(FakeDriver):
        def state(self, pid: int) -> int | None:
            return restored_drv.states.get(pid, CHECKPOINTED)

    waiting = Waiting()
    waiting.calls = restored_drv.calls
    waiting.states = restored_drv.states
    job = Job.restore(cluster.store, "job", [(moved, cluster.nodes[1])], devices=DeviceState(lambda: waiting))
    pids = job.ranks[0].pids()
    assert [c for c in waiting.calls if c[0] == "restore"] == [("restore", p, {U0: U1}) for p in pids]
    assert [c for c in waiting.calls if c[0] == "unlock"] == [("unlock", p) for p in pids]
    job.kill()
