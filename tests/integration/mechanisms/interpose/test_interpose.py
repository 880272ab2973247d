"""The interposer with real ranks under real CRIU: DDP jobs of 2 and 4 ranks are cut consistently at any
moment, checkpointed, killed and restored on other node roots, and every rank's output and the final
parameters stay byte-identical to plain ``torchrun``. Jobs that cannot be cut yet are refused and go on;
a stopped rank makes the request time out without harm; a request before every rank has loaded the
interposer does not split the rendezvous; jobs without torch.distributed are frozen together; scripts
that do not use torch.distributed see no difference."""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pytest

from tests.integration.ranks import EXAMPLES, Cluster
from tidal.core.cutplan import Plan
from tidal.errors import Unsupported
from tidal.mechanisms.criu.job import Job, Then
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec
from tidal.mechanisms.criu.tasks import descendants
from tidal.mechanisms.interpose.channel import CutTimeout, Store, new_epoch
from tidal.mechanisms.interpose.storeserver import RendezvousServer
from tidal.testing import wait_for_line, wait_until
from tidal.testing.torchrun import EXIT_ABORT, TorchRun

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]

DDP = EXAMPLES / "ddp_train.py"
SCRIPTS = Path(__file__).with_name("scripts")
UNSUPPORTED = SCRIPTS / "dist_unsupported.py"
LATE_WAIT = SCRIPTS / "late_wait.py"
STEP_LINE = re.compile(rb"^rank \d+ step (\d+) ", re.M)


def _env() -> dict[str, str]:
    """The environment of every run here, with Tidal or without: one thread per rank, as torchrun sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV", "TIDAL_"))}
    env.pop("PYTHONPATH", None)
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def rendezvous() -> Iterator[RendezvousServer]:
    server = RendezvousServer()
    yield server
    server.close()


class Reference:
    """One plain ``torchrun`` run, started in the background while the test drives Tidal: its per-rank
    stdout and the params.bin it wrote."""

    def __init__(self, root: Path, argv: list[str], world: int) -> None:
        root.mkdir()
        self.run, self.world = TorchRun(argv, nproc=world, cwd=root, logs=root / "logs", env=_env()), world
        self._logs: list[bytes] | None = None

    def _finish(self) -> list[bytes]:
        if self._logs is None:
            self.run.wait(300)
            self._logs = []
            for r in range(self.world):
                assert self.run.stderr(r) in ("", EXIT_ABORT), self.run.stderr(r)
                self._logs.append(self.run.stdout(r).encode())
        return self._logs

    def log(self, rank: int) -> bytes:
        return self._finish()[rank]

    @property
    def params(self) -> bytes:
        self._finish()
        return (self.run.cwd / "params.bin").read_bytes()

    def kill(self) -> None:
        self.run.kill()


StartRef = Callable[[list[str], int], Reference]


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartRef]:
    """Starts the plain ``torchrun`` run of a command once per module (tests with the same command share it)."""
    root = tmp_path_factory.mktemp("torchrun")
    started: dict[tuple[tuple[str, ...], int], Reference] = {}

    def start(argv: list[str], world: int) -> Reference:
        key = (tuple(argv), world)
        if key not in started:
            started[key] = Reference(root / f"run-{len(started)}", argv, world)
        return started[key]

    yield start
    for ref in started.values():
        ref.kill()


def rank_specs(cluster: Cluster, argv: list[str], world: int, store: str, prefix: str) -> list[RankSpec]:
    """W ranks with the torchrun environment, rendezvousing on Tidal's store under ``prefix``."""
    return [RankSpec("job", r, tuple(argv), cluster.workdir, {
        **_env(), "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TIDAL_STORE": store, "TIDAL_STORE_PREFIX": prefix,
    }) for r in range(world)]


def log(job: Job, rank: int) -> Path:
    rp = next(r for r in job.ranks if r.spec.rank == rank)
    return rp.node.log_path(rp.spec)


def wait_step(job: Job, rank: int, step: int, timeout: float = 120) -> None:
    wait_for_line(log(job, rank), rf"^rank {rank} step {step} ", timeout=timeout)


def last_step(text: bytes) -> int:
    """The last step a rank printed (-1: none yet)."""
    steps = STEP_LINE.findall(text)
    return int(steps[-1]) if steps else -1


def ddp_argv(steps: int, step_time: float = 0.05, gate: tuple[Path, int] | None = None) -> list[str]:
    """``gate``: (file, step): from that step on, every rank waits until the file exists (so does the plain
    torchrun run of the same command), so that the job cannot end before the test lets it."""
    argv = [str(DDP), "--steps", str(steps), "--step-time", str(step_time), "--collectives", "--hidden", "64"]
    return argv + (["--gate", f"{gate[0]}:{gate[1]}"] if gate else [])


def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


# DDP with --collectives, counted at a gate: building the group issues 1 collective and DDP's construction
# 3 (parameter check, broadcast of the module state); each step then issues one bucket all-reduce and three
# direct collectives, and the second step 2 more, when DDP rebuilds its buckets.
PER_STEP = 4


def done(step: int) -> int:
    """How many collectives a rank has issued once it has finished ``step`` (-1: none yet)."""
    return 1 + 3 + PER_STEP * (step + 1) + (2 if step >= 1 else 0)


@pytest.mark.parametrize(("world", "periodic"), [(2, 3), (4, 1)], ids=["W2", "W4"])
def test_ddp_cut_at_random_moments_restores_identically(cluster: Cluster, rendezvous: RendezvousServer,
                                                        torchrun: StartRef, world: int, periodic: int) -> None:
    steps, gate = 100, 95
    release = cluster.root / "release"
    argv = ddp_argv(steps, 0.05, (release, gate))
    ref = torchrun(argv, world)
    rng = random.Random(1000 + world)
    pre = prefix()
    specs = rank_specs(cluster, [sys.executable, *argv], world, rendezvous.addr, f"{pre}/1")
    nodes = cluster.nodes
    job = Job.launch("job", [(s, nodes[0]) for s in specs], cluster.store)
    cuts: list[int] = []

    def at_random_moment() -> None:
        """Wait until a random rank has printed a step a random 0..3 steps beyond where it was (or has
        reached the gate)."""
        r = rng.randrange(world)
        wait_step(job, r, min(gate - 1, max(0, last_step(log(job, r).read_bytes())) + rng.randrange(4)))

    def checkpoint(then: Then) -> None:
        before = [last_step(log(job, r).read_bytes()) for r in range(world)]
        info = job.checkpoint(then=then)
        assert job.last_cut is not None
        # The cut lies between the steps the ranks had printed at the request and those in the checkpoint.
        reader = cluster.store.reader("job", info.id)
        at_cut = [last_step(reader.read_bytes(f"ranks/{r}/output.log")) for r in range(world)]
        for r in range(world):
            assert at_cut[r] >= before[r]
            # Every collective of the printed steps was issued; none beyond the next step.
            assert done(at_cut[r]) <= job.last_cut <= done(at_cut[r] + 1)
        assert max(at_cut) - min(at_cut) <= 1  # no rank ran ahead of another by a whole step
        assert not cuts or job.last_cut >= cuts[-1]
        cuts.append(job.last_cut)

    # Periodic checkpoints at seeded random moments.
    for _ in range(periodic):
        at_random_moment()
        checkpoint("continue")
        assert all(r.running for r in job.ranks)
    # Preempt, restore every rank on another node root, with a new rendezvous.
    at_random_moment()
    checkpoint("kill")
    assert [r.wait(30).signal for r in job.ranks] == [signal.SIGKILL] * len(job.ranks)
    job = Job.restore(cluster.store, "job", [(s, nodes[1]) for s in specs],
                      rendezvous=Store(rendezvous.addr, f"{pre}/2"))
    at_random_moment()
    checkpoint("continue")
    at_random_moment()
    checkpoint("kill")
    # Then spread over two node roots: the first half of the ranks on one, the rest on another.
    half = world // 2
    spread: list[tuple[RankSpec, NodeRoot]] = [(s, nodes[2] if s.rank < half else nodes[0]) for s in specs]
    job = Job.restore(cluster.store, "job", spread, rendezvous=Store(rendezvous.addr, f"{pre}/3"))
    assert {r.spec.rank: r.node.name for r in job.ranks} == {s.rank: n.name for s, n in spread}
    release.touch()
    assert [s.code for s in job.wait(180)] == [0] * world
    assert cuts[-1] > cuts[0]
    assert len(cluster.store.list("job")) == len(cuts)
    for r in range(world):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"
    assert (cluster.workdir / "params.bin").read_bytes() == ref.params


def test_ranks_cut_over_two_node_roots_go_on_once_dumped(cluster: Cluster, rendezvous: RendezvousServer,
                                                        torchrun: StartRef) -> None:
    """The steps an agent per node takes for a checkpoint of a job spread over nodes (counts → park →
    checkpoint at the cut), on two node roots at once: with the job going on, every rank steps again once its
    node has dumped it, with no release(), which then finds nothing held; the run stays identical to torchrun
    and the checkpoint is a part per node."""
    world, steps, gate = 4, 100, 95
    release = cluster.root / "release"
    argv = ddp_argv(steps, 0.05, (release, gate))
    ref = torchrun(argv, world)
    specs = rank_specs(cluster, [sys.executable, *argv], world, rendezvous.addr, f"{prefix()}/1")
    a = Job.launch("job", [(s, cluster.nodes[0]) for s in specs[:2]], cluster.store)
    b = Job.launch("job", [(s, cluster.nodes[1]) for s in specs[2:]], cluster.store, track_fs=False)
    try:
        for job, r in ((a, 0), (a, 1), (b, 2), (b, 3)):
            wait_step(job, r, 10)
        epoch = new_epoch()
        target = max(n for job in (a, b) for n in job.report(epoch).counts.values())
        with ThreadPoolExecutor(2) as pool:  # every node at once, as the control plane orders them
            list(pool.map(lambda job: job.park(epoch, target), (a, b)))
            infos = list(pool.map(lambda job, ck: job.checkpoint("continue", checkpoint_id=ck, cut_at=(epoch, target)),
                                  (a, b), ("ck.p0", "ck.p1")))
        for job, ranks, info in ((a, (0, 1), infos[0]), (b, (2, 3), infos[1])):
            for r in ranks:
                at_cut = last_step(cluster.store.reader("job", info.id).read_bytes(f"ranks/{r}/output.log"))
                wait_step(job, r, at_cut + 2, timeout=60)  # going on, unreleased
        a.release()
        b.release()
        assert sorted(i.id for i in cluster.store.list("job")) == ["ck.p0", "ck.p1"]
        release.touch()
        assert [s.code for job in (a, b) for s in job.wait(180)] == [0] * world
    finally:
        a.kill()
        b.kill()
    for job, r in ((a, 0), (a, 1), (b, 2), (b, 3)):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"
    assert (cluster.workdir / "params.bin").read_bytes() == ref.params


GROUPS = SCRIPTS / "dist_groups.py"


def test_disjoint_subgroups_run_to_the_end_identically(cluster: Cluster, rendezvous: RendezvousServer,
                                                       torchrun: StartRef) -> None:
    # new_group([0, 2]) and new_group([1, 3]) once hung for ever (both on the same store keys).
    argv = [str(GROUPS), "--steps", "6"]
    ref = torchrun(argv, 4)
    specs = rank_specs(cluster, [sys.executable, *argv], 4, rendezvous.addr, prefix())
    job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
    assert [s.code for s in job.wait(120)] == [0] * 4
    for r in range(4):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"


def test_subgroups_and_p2p_cut_at_random_moments_restore_identically(
        cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef) -> None:
    # Sub-groups (disjoint, new_subgroups, a 2-D DeviceMesh) and point-to-point on the world group and in
    # a sub-group: checkpointed at seeded random moments, preempted, restored with one rank on another node
    # root, and identical to torchrun.
    world, steps, gate = 4, 60, 55
    release = cluster.root / "release"
    argv = [str(GROUPS), "--steps", str(steps), "--step-time", "0.03", "--gate", f"{release}:{gate}"]
    ref = torchrun(argv, world)
    rng = random.Random(18)
    pre = prefix()
    specs = rank_specs(cluster, [sys.executable, *argv], world, rendezvous.addr, f"{pre}/1")
    nodes = cluster.nodes
    job = Job.launch("job", [(s, nodes[0]) for s in specs], cluster.store)
    taken = 0

    def at_random_moment() -> None:
        r = rng.randrange(world)
        wait_step(job, r, min(gate - 1, max(0, last_step(log(job, r).read_bytes())) + rng.randrange(4)))

    def checkpoint(then: Then) -> None:
        nonlocal taken
        job.checkpoint(then=then)
        taken += 1
        at_cut = [last_step(log(job, r).read_bytes()) for r in range(world)]
        assert max(at_cut) - min(at_cut) <= 2, at_cut  # no rank ran far ahead of another

    for _ in range(3):
        at_random_moment()
        checkpoint("continue")
        assert all(r.running for r in job.ranks)
    at_random_moment()
    checkpoint("kill")
    assert [r.wait(30).signal for r in job.ranks] == [signal.SIGKILL] * world
    # One rank moves to another node root; the others to a second one.
    moved = [(s, nodes[2] if s.rank == 3 else nodes[1]) for s in specs]
    job = Job.restore(cluster.store, "job", moved, rendezvous=Store(rendezvous.addr, f"{pre}/2"))
    at_random_moment()
    checkpoint("continue")
    at_random_moment()
    checkpoint("kill")
    job = Job.restore(cluster.store, "job", [(s, nodes[0]) for s in specs],
                      rendezvous=Store(rendezvous.addr, f"{pre}/3"))
    release.touch()
    assert [s.code for s in job.wait(180)] == [0] * world
    assert len(cluster.store.list("job")) == taken
    for r in range(world):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"


def cut_over_nodes(jobs: Sequence[Job], epoch: int,
                   first_round: Callable[[], None] = lambda: None) -> tuple[int, Plan]:
    """What the control plane does for a job spread over nodes, one :class:`Job` a node: the counts of every
    node, then park rounds on every node at once until none raises the targets. The first node that answers
    with needs raises them, and the round still running on the others gives way to the next one. Returns
    the world group's target and the plan every rank parked at. ``first_round``: called once the first
    round is out."""
    reports = [job.report(epoch) for job in jobs]
    plan = Plan.from_counts(r.comms for r in reports)
    default = next((r.default for r in reports if r.default), None)
    for n in itertools.count():
        with ThreadPoolExecutor(len(jobs)) as pool:
            rounds = [pool.submit(job.park, epoch, Plan.from_message(plan.message())) for job in jobs]
            if n == 0:
                first_round()
            needs = []
            for done in as_completed(rounds):
                needs = done.result()
                if needs:
                    if not plan.raise_for(needs):
                        plan.version += 1
                    for job in jobs:
                        job.supersede(epoch, plan.version)
                    break
        if not needs:
            return plan.target(default), plan
    raise AssertionError("unreachable")


def test_subgroups_and_p2p_spread_over_two_node_roots_cut_in_rounds_restore_identically(
        cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef) -> None:
    """The steps of the agents of two nodes for a job whose disjoint sub-groups ([0, 2], [1, 3]) and ring of
    sends cross the nodes: counts per communicator, park rounds, checkpoint at the cut, one part per node;
    periodic checkpoints at seeded random moments, a stop, a restore with the ranks on other node roots and
    split otherwise, and the run identical to torchrun."""
    world, steps, gate = 4, 60, 55
    release = cluster.root / "release"
    argv = [str(GROUPS), "--steps", str(steps), "--step-time", "0.03", "--gate", f"{release}:{gate}"]
    ref = torchrun(argv, world)
    rng = random.Random(1818)
    pre = prefix()
    specs = rank_specs(cluster, [sys.executable, *argv], world, rendezvous.addr, f"{pre}/1")
    nodes = cluster.nodes
    jobs = [Job.launch("job", [(s, nodes[0]) for s in specs[:2]], cluster.store),
            Job.launch("job", [(s, nodes[1]) for s in specs[2:]], cluster.store, track_fs=False)]
    taken: list[str] = []

    def owner(r: int) -> Job:
        return next(j for j in jobs if any(rp.spec.rank == r for rp in j.ranks))

    def at_random_moment() -> None:
        r = rng.randrange(world)
        wait_step(owner(r), r, min(gate - 1, max(0, last_step(log(owner(r), r).read_bytes())) + rng.randrange(4)))

    def checkpoint(then: Then) -> list[str]:
        epoch = new_epoch()
        target, plan = cut_over_nodes(jobs, epoch)
        assert set(plan.targets) > {"0"}  # the sub-groups' and the pairs' own communicators too
        ck = f"ck{len(taken) // 2}"
        with ThreadPoolExecutor(len(jobs)) as pool:
            infos = list(pool.map(lambda job, part: job.checkpoint(then, checkpoint_id=part, cut_at=(epoch, target)),
                                  jobs, (f"{ck}.p0", f"{ck}.p1")))
        parts = [i.id for i in infos]
        taken.extend(parts)
        at_cut = [last_step(cluster.store.reader("job", info.id).read_bytes(f"ranks/{rp.spec.rank}/output.log"))
                  for info, job in zip(infos, jobs, strict=True) for rp in job.ranks]
        assert max(at_cut) - min(at_cut) <= 2, at_cut
        for job in jobs:
            if then == "hold":
                job.kill()
            else:
                job.release()
        return parts

    try:
        for _ in range(2):
            at_random_moment()
            checkpoint("continue")
            assert all(r.running for job in jobs for r in job.ranks)
        at_random_moment()
        parts = checkpoint("hold")  # a migration: the ranks stay frozen until every part is stored
        # Ranks 0 and 3 on one node root, 1 and 2 on another: each sub-group and the ring still cross nodes.
        split = [[specs[0], specs[3]], [specs[1], specs[2]]]
        jobs = [Job.restore(cluster.store, "job", [(s, nodes[2 - k]) for s in half], checkpoint_id=parts,
                            rendezvous=Store(rendezvous.addr, f"{pre}/2"), track_fs=k == 0)
                for k, half in enumerate(split)]
        at_random_moment()
        checkpoint("continue")
        release.touch()
        assert [s.code for job in jobs for s in job.wait(180)] == [0] * world
    finally:
        for job in jobs:
            job.kill()
    assert len(cluster.store.list("job")) == len(taken)
    for r in range(world):
        assert log(owner(r), r).read_bytes() == ref.log(r), f"rank {r}"


NEED = SCRIPTS / "dist_need.py"


def test_a_need_on_one_node_raises_the_targets_of_the_other_and_the_cut_ends_identical(
        cluster: Cluster, rendezvous: RendezvousServer, torchrun: StartRef) -> None:
    """Rank 0 on one node root waits inside its all-reduce on [0, 1] while rank 1, on the other, must first
    all-reduce on [1, 2], which no rank had announced at the cut: rank 1's node answers its first park round
    with that need, rank 0's node's round gives way to the next one, with the target raised, and every rank
    parks. The job is then stopped, restored with the ranks on other node roots, and ends as under torchrun."""
    hold, wait = 4, cluster.root / "wait"
    argv = [str(NEED), "--steps", "8", "--hold", str(hold), "--wait", str(wait)]
    ref = torchrun([str(NEED), "--steps", "8", "--hold", str(hold)], 3)
    pre = prefix()
    specs = rank_specs(cluster, [sys.executable, *argv], 3, rendezvous.addr, f"{pre}/1")
    nodes = cluster.nodes
    jobs = [Job.launch("job", [(specs[0], nodes[0])], cluster.store),
            Job.launch("job", [(s, nodes[1]) for s in specs[1:]], cluster.store, track_fs=False)]
    try:
        wait_for_line(log(jobs[0], 0), rf"^rank 0 issued {hold}$", timeout=120)
        epoch = new_epoch()
        # Rank 1 comes to the gate of [1, 2] only once let go, after the first round has gone out.
        target, plan = cut_over_nodes(jobs, epoch, first_round=wait.touch)
        # Group [1, 2]: built (its first op) and all-reduced once a step before step ``hold``, and one more.
        (left,) = [k for k, m in plan.members.items() if m == [1, 2]]
        assert plan.version >= 1 and plan.targets[left] == hold + 2, plan
        infos = [job.checkpoint("hold", checkpoint_id=f"ck.p{k}", cut_at=(epoch, target))
                 for k, job in enumerate(jobs)]
        for job in jobs:
            job.kill()
        jobs = [Job.restore(cluster.store, "job", [(specs[0], nodes[2]), (specs[2], nodes[2])],
                            checkpoint_id=[i.id for i in infos], rendezvous=Store(rendezvous.addr, f"{pre}/2")),
                Job.restore(cluster.store, "job", [(specs[1], nodes[0])], checkpoint_id=[i.id for i in infos],
                            rendezvous=Store(rendezvous.addr, f"{pre}/2"), track_fs=False)]
        assert [s.code for job in jobs for s in job.wait(120)] == [0] * 3
    finally:
        for job in jobs:
            job.kill()
    for job in jobs:
        for rp in job.ranks:
            r = rp.spec.rank
            assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"


def test_sends_not_yet_waited_on_are_waited_at_the_cut(cluster: Cluster, rendezvous: RendezvousServer,
                                                       torchrun: StartRef, tmp_path: Path) -> None:
    # Gloo says a send completed only once waited on: a rank cut while it holds sends its script waits on
    # later (a pipeline schedule's forward sends) once never parked, and every checkpoint timed out.
    gate = tmp_path / "gate"
    opened = tmp_path / "open"
    opened.touch()
    ref = torchrun([str(LATE_WAIT), "--gate", str(opened)], 2)
    specs = rank_specs(cluster, [sys.executable, str(LATE_WAIT), "--gate", str(gate)], 2, rendezvous.addr, prefix())
    job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
    job.cut_timeout = 15.0
    wait_until(lambda: all(Path(f"{gate}.{r}").exists() for r in range(2)), timeout=120,
               what="both ranks at the gate, rank 0 holding four sends not waited on")
    info = job.checkpoint("continue")
    assert [i.id for i in cluster.store.list("job")] == [info.id]
    gate.touch()
    assert [s.code for s in job.wait(120)] == [0, 0]
    for r in range(2):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"


def test_receive_from_any_source_refuses_the_cut_and_goes_on(cluster: Cluster, rendezvous: RendezvousServer,
                                                             torchrun: StartRef) -> None:
    argv = [str(UNSUPPORTED), "--steps", "60", "--step-time", "0.05"]
    ref = torchrun(argv, 2)
    specs = rank_specs(cluster, [sys.executable, *argv], 2, rendezvous.addr, prefix())
    job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
    pids = [r.pid for r in job.ranks]
    for r in range(2):
        wait_step(job, r, 3)
    for then in ("continue", "kill"):
        with pytest.raises(Unsupported) as err:
            job.checkpoint(then=then)  # type: ignore[arg-type]
        assert err.value.message == (
            "this job cannot be checkpointed: rank job.r1: the job receives from any source (recv without "
            "src): such a receive cannot be matched to its sender at a cut")
        assert "dist.recv(t, src=...)" in (err.value.hint or "")
        assert cluster.store.list("job") == []
        assert [r.pid for r in job.ranks] == pids and all(r.running for r in job.ranks)
    assert [s.code for s in job.wait(120)] == [0, 0]
    for r in range(2):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"


def _python_pid(job: Job, rank: int) -> int:
    """The rank's Python process (the child of its init)."""
    rp = next(r for r in job.ranks if r.spec.rank == rank)
    (pid,) = [p for p in descendants(rp.pid) if p != rp.pid]
    return pid


def test_stopped_rank_times_out_keeps_last_checkpoint_and_finishes(cluster: Cluster, rendezvous: RendezvousServer,
                                                                  torchrun: StartRef) -> None:
    gate = 30
    release = cluster.root / "release"
    argv = ddp_argv(40, 0.05, (release, gate))
    ref = torchrun(argv, 2)
    specs = rank_specs(cluster, [sys.executable, *argv], 2, rendezvous.addr, prefix())
    job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
    job.cut_timeout = 1.0
    wait_step(job, 1, 2)
    good = job.checkpoint(then="continue")
    wait_step(job, 1, min(gate - 1, last_step(log(job, 1).read_bytes()) + 2))
    stopped = _python_pid(job, 1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        wait_for_line(Path(f"/proc/{stopped}/status"), r"^State:\s+T ")
        started = time.monotonic()
        with pytest.raises(CutTimeout, match="job.r1") as err:
            job.checkpoint(then="kill")
        assert time.monotonic() - started < 10
        assert "stopped" in str(err.value)
        assert [c.id for c in cluster.store.list("job")] == [good.id]
        assert cluster.store.latest("job").id == good.id  # type: ignore[union-attr]
        assert all(r.running for r in job.ranks)
    finally:
        os.kill(stopped, signal.SIGCONT)
    # Once the rank goes on, so does the job, and the next request succeeds.
    wait_step(job, 1, min(gate - 1, last_step(log(job, 1).read_bytes()) + 2))
    second = job.checkpoint(then="continue")
    assert [c.id for c in cluster.store.list("job")] == [good.id, second.id]
    release.touch()
    assert [s.code for s in job.wait(120)] == [0, 0]
    for r in range(2):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"
    assert (cluster.workdir / "params.bin").read_bytes() == ref.params


# Two ranks running an ordinary single-process training script (each in its own subdirectory, with its own
# seed), and a third that is a shell loop (which starts once rank 0 trains): no torch.distributed anywhere.
# The two training ranks start together (each waits for the other's directory) and take long enough that
# neither has ended by the second checkpoint, however slowly the other started on a busy machine.
TRAIN_RANK = ["sh", "-c", 'mkdir -p r$RANK && until [ -d r0 ] && [ -d r1 ]; do sleep 0.01; done && cd r$RANK && '
              'exec "$0" "$1" --steps 200 --step-time 0.05 --seed $RANK', sys.executable, str(EXAMPLES / "train.py")]
LOOP_RANK = ["sh", "-c", 'until [ -e r0/metrics.csv ]; do sleep 0.01; done; i=0; while [ $i -lt 350 ]; do i=$((i+1)); '
             'echo "tick $i"; sleep 0.03; done']


def test_ranks_without_torch_distributed_are_frozen_together(cluster: Cluster) -> None:
    argvs = [TRAIN_RANK, TRAIN_RANK, LOOP_RANK]
    env = {**_env(), "WORLD_SIZE": "3"}
    specs = [RankSpec("job", r, tuple(a), cluster.workdir, {**env, "RANK": str(r)}) for r, a in enumerate(argvs)]
    (cluster.root / "ref").mkdir()
    refs = [subprocess.Popen(a, cwd=cluster.root / "ref", env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for r, a in enumerate(argvs)]
    try:
        _frozen_together(cluster, specs, refs)
    finally:  # a failed test must not leave its reference runs waiting forever
        for proc in refs:
            proc.kill()
            proc.wait()


def _frozen_together(cluster: Cluster, specs: list[RankSpec], refs: list[subprocess.Popen[bytes]]) -> None:
    job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
    for r in (0, 1):
        wait_for_line(log(job, r), r"^step 5 ")
    wait_for_line(log(job, 2), r"^tick 2$")
    info = job.checkpoint(then="kill")
    assert job.last_cut == 0  # the Python ranks had nothing to cut, and the shell rank has no interposer
    assert [bool(r.channel and r.channel.hello.is_set()) for r in job.ranks] == [True, True, False]
    reader = cluster.store.reader("job", info.id)
    assert sorted(n.split("/")[1] for n in reader.names() if n.endswith("/output.log")) == ["0", "1", "2"]
    job = Job.restore(cluster.store, "job", [(s, cluster.nodes[1]) for s in specs])
    wait_for_line(log(job, 0), r"^step 10 ")
    job.checkpoint(then="continue")
    assert job.last_cut == 0
    assert [s.code for s in job.wait(120)] == [0, 0, 0]
    for r, proc in enumerate(refs):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert log(job, r).read_bytes() == out, f"rank {r}"
    for r in (0, 1):
        for name in ("metrics.csv", "params.bin"):
            assert (cluster.workdir / f"r{r}" / name).read_bytes() == (cluster.root / "ref" / f"r{r}" / name
                                                                      ).read_bytes()


def test_scripts_without_torch_distributed_run_unchanged(cluster: Cluster, tmp_path: Path) -> None:
    """A plain Python script, a torch script without torch.distributed, and a script whose user has a
    sitecustomize of their own on PYTHONPATH: output, exit code and files as without Tidal."""
    cases = {
        "plain": ([sys.executable, str(SCRIPTS / "plain.py"), "a", "b"], {}),
        "usersite": ([sys.executable, str(SCRIPTS / "plain.py")], {"PYTHONPATH": str(SCRIPTS / "usersite")}),
        "torch": ([sys.executable, str(SCRIPTS / "torch_local.py")], {}),
    }
    jobs = {}
    for name, (argv, extra) in cases.items():
        wd = tmp_path / name / "work"
        wd.mkdir(parents=True)
        spec = RankSpec(name, 0, tuple(argv), wd, {**_env(), **extra})
        jobs[name] = Job.launch(name, [(spec, cluster.nodes[0])], cluster.store)
    for name, (argv, extra) in cases.items():
        ref_wd = tmp_path / name / "ref"
        ref_wd.mkdir()
        ref = subprocess.run(argv, cwd=ref_wd, env={**_env(), **extra}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=120)
        (status,) = jobs[name].wait(120)
        assert status.code == ref.returncode, name
        assert log(jobs[name], 0).read_bytes() == ref.stdout, name
        for f in ref_wd.iterdir():
            assert (tmp_path / name / "work" / f.name).read_bytes() == f.read_bytes()
    assert b"user sitecustomize ran" in log(jobs["usersite"], 0).read_bytes()
    assert b"user sitecustomize ran" not in log(jobs["plain"], 0).read_bytes()


# Rank 0 loads the interposer at once, then waits for a file before running the script; rank 1 waits for it
# before it even starts Python.
GATED = ("import os, runpy, sys, time\n"
         "while not os.path.exists('go'): time.sleep(0.01)\n"
         "sys.argv = sys.argv[1:]\n"
         "runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.parametrize("then", ["continue", "kill"])
def test_checkpoint_before_every_rank_loaded_the_interposer(cluster: Cluster, torchrun: StartRef, then: Then) -> None:
    """A checkpoint while one rank has loaded the interposer and another has not started Python yet: both
    still meet on one rendezvous afterwards, also when the job is restored onto another store."""
    argv = ddp_argv(30)
    ref = torchrun(argv, 2)
    first = RendezvousServer()
    specs = rank_specs(cluster, [sys.executable, "-c", GATED, *argv], 2, first.addr, prefix())
    late = ["sh", "-c", 'until [ -e go ]; do sleep 0.01; done; exec "$@"', "sh", sys.executable, *argv]
    specs[1] = RankSpec("job", 1, tuple(late), cluster.workdir, specs[1].env)
    moved = None
    try:
        job = Job.launch("job", [(s, cluster.nodes[0]) for s in specs], cluster.store)
        channels = [r.channel for r in job.ranks]
        assert channels[0] is not None and channels[1] is not None
        assert channels[0].hello.wait(60)
        job.checkpoint(then=then)
        assert job.last_cut == 0 and not channels[1].hello.is_set()
        if then == "kill":
            first.close()  # the store is gone: every restored rank must use the new one
            moved = RendezvousServer()
            job = Job.restore(cluster.store, "job", [(s, cluster.nodes[1]) for s in specs],
                              rendezvous=Store(moved.addr, prefix()))
        (cluster.workdir / "go").touch()
        assert [s.code for s in job.wait(120)] == [0, 0]
    finally:
        first.close()
        if moved is not None:
            moved.close()
    for r in range(2):
        assert log(job, r).read_bytes() == ref.log(r), f"rank {r}"
    assert (cluster.workdir / "params.bin").read_bytes() == ref.params


HOLDS = SCRIPTS / "holds.py"


def _io_uring_works() -> bool:
    import ctypes

    fd = ctypes.CDLL(None, use_errno=True).syscall(425, 4, ctypes.create_string_buffer(120))
    if fd >= 0:
        os.close(fd)
    return fd >= 0


# What a rank holds, the start of how the refusal names it, and the start of what it says to do.
HELD = {
    "tcp": (r"a TCP connection 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:{port} \(fd \d+\)", "close the connection before"),
    "io_uring": (r"an io_uring instance \(fd \d+\)", "use ordinary file I/O (CRIU cannot checkpoint io_uring)"),
    "listen": (r"a listening TCP socket on 127\.0\.0\.1:\d+ \(fd \d+\)", "close the socket before"),
    "udp": (r"a UDP socket on 127\.0\.0\.1:\d+ \(fd \d+\)", "close the socket before"),
    "unconnected": (r"a TCP socket that is not connected \(or was closed by its peer\) \(fd \d+\)",
                    "close the socket before"),
    "closed-by-peer": (r"a TCP socket 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:{port} in state CLOSE_WAIT \(fd \d+\)",
                       "close the socket before"),
    "reset-by-peer": (r"a TCP socket( on \S+)? that is not connected \(or was closed by its peer\) \(fd \d+\)",
                      "close the socket before"),
}


@pytest.mark.parametrize("what", list(HELD))
def test_what_cannot_be_checkpointed_is_named_and_the_job_goes_on(cluster: Cluster, what: str) -> None:
    # Since Linux 6.16 CRIU fails on an internet socket in any state (it reads SO_PASSCRED, which such a kernel
    # refuses for it): each is named before anything is frozen, as an established connection always is.
    import socket

    from tidal.mechanisms.criu.resources import inet_dumpable

    if what == "io_uring" and not _io_uring_works():
        pytest.skip("this kernel refuses io_uring_setup (kernel.io_uring_disabled)")
    if what not in ("tcp", "io_uring") and inet_dumpable():
        pytest.skip("CRIU can dump this socket on this kernel")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    extra = {"tcp": ["--tcp", f"127.0.0.1:{port}"], "closed-by-peer": ["--tcp", f"127.0.0.1:{port}"],
             "reset-by-peer": ["--tcp", f"127.0.0.1:{port}"]}.get(what, [f"--{what.replace('_', '-')}"])
    spec = RankSpec(
        "job", 0, (sys.executable, str(HOLDS), *extra), cluster.workdir, _env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    accepted = []
    try:
        if "--tcp" in extra:
            accepted.append(server.accept()[0])  # the outside service's end, open while the job runs
        if what == "reset-by-peer":  # the service resets the connection: the rank's end is listed nowhere
            accepted[0].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if what in ("closed-by-peer", "reset-by-peer"):
            accepted.pop().close()
        wait_for_line(log(job, 0), r"^tick 2$")
        (pid,) = [p for p in job.ranks[0].pids() if p != job.ranks[0].pid]
        held, hint = HELD[what]
        for then in ("continue", "kill"):
            with pytest.raises(Unsupported) as err:
                job.checkpoint(then=then)  # type: ignore[arg-type]
            assert re.fullmatch(f"job job cannot be checkpointed: process {pid} \\(python[^)]*\\) holds "
                                + held.replace("{port}", str(port)), err.value.message), err.value.message
            assert err.value.hint and err.value.hint.startswith(hint), err.value.hint
            assert cluster.store.list("job") == []
            assert job.ranks[0].running
        # It goes on: more ticks come.
        n = int(re.findall(rb"^tick (\d+)$", log(job, 0).read_bytes(), re.M)[-1])
        wait_for_line(log(job, 0), rf"^tick {n + 3}$")
    finally:
        job.kill()
        for sock in [*accepted, server]:
            sock.close()
