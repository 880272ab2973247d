"""Tidal on a cgroup2-only host, in a v2-only view of this machine (:mod:`tests.integration.cgroup2_view`),
and the v1 path beside it in the machine's own mount namespace.

In the view: the layout is detected as v2 and `tidal doctor`'s cgroup rows pass; a rank group freezes (the
kernel says so in ``cgroup.events``, and the processes stop), thaws, takes the children its members fork,
and is killed as one, frozen or not, with ``cgroup.kill`` and without it; a real rank is frozen through
``cgroup.freeze``, dumped by CRIU with ``--freeze-cgroup`` on its cgroup2 path, restored and finishes with the
output of an uninterrupted run; a rank moved below a device's group is still frozen, dumped and fenced there;
an agent fences a rank left frozen; a checkpoint taken on v1 restores on v2 and back; the CPU quota caps a
rank where the view has the cpu controller (else the test is skipped, saying why)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.cgroup2_view import run_in_v2_view, skip
from tests.integration.ranks import reference_run
from tidal.mechanisms.criu import cgroups
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec
from tidal.mechanisms.criu.runner import CriuRunner
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing import wait_for_line, wait_until

pytestmark = pytest.mark.criu

LOOP = ["sh", "-c", 'i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo "tick $i"; sleep 0.02; done; echo done']


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV"))}


def _node(tmp: Path, name: str) -> NodeRoot:
    # NodeRoot names key the ranks' cgroups: unique per test run, so that runs side by side never meet.
    return NodeRoot(f"{name}-{os.getpid()}-{tmp.name[-12:]}", tmp / name)


def _remove_node_groups(*nodes: NodeRoot) -> None:
    """Remove the nodes' (empty) directories of rank groups, once their ranks have left them."""
    h = cgroups.hierarchy()
    for n in nodes:
        path = h.node_path(n.name)
        wait_until(lambda p=path: not p.exists() or p.rmdir() is None, timeout=10, what=f"{path} to be removable")


def _cgroup_of(pid: int) -> str:
    """The process's cgroup2 group ("0::/path" in /proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"pid {pid} has no cgroup2 line")


class RecordingRunner(CriuRunner):
    """CRIU as Tidal runs it, keeping each dump's freeze cgroup and (full) log."""

    def __init__(self) -> None:
        super().__init__()
        self.log_level = 4  # the log then says which freezer CRIU found
        self.dumps: list[tuple[Path | None, str]] = []

    def dump(self, pid: int, images: Path, *, freezer: Path | None, ghost_limit: int,
             prefix: Path | None = None) -> None:
        super().dump(pid, images, freezer=freezer, ghost_limit=ghost_limit, prefix=prefix)
        self.dumps.append((freezer, (images / "dump.log").read_text(errors="replace")))


# --------------------------------------------------------------------------- the view itself


def in_view_layout_and_doctor() -> None:
    from tidal.mechanisms.checks import check_cgroups

    h = cgroups.hierarchy()
    assert isinstance(h, cgroups.V2) and h.mount == Path("/sys/fs/cgroup"), h
    rows = {c.name: c for c in check_cgroups()}
    assert rows["cgroups"].status == "ok" and rows["cgroups"].detail.startswith("v2 at /sys/fs/cgroup (v2)")
    freezer = rows["cgroup freezer"]
    assert freezer.status == "ok" and "cgroup.freeze" in freezer.detail, freezer
    assert not any(c.failed for c in rows.values()), rows
    for c in ("cpu", "cpuset"):  # present or not, a warning at most
        assert rows[f"cgroup {c}"].status in ("ok", "warn")
    print("controllers in the view:", sorted(cgroups.v2_controllers(h.mount)), flush=True)
    print(*(f"{c.name}: {c.status}: {c.detail}" for c in rows.values()), sep="\n", flush=True)


def test_the_view_is_cgroup2_only_and_doctor_passes() -> None:
    run_in_v2_view(in_view_layout_and_doctor)


def test_the_machine_itself_keeps_its_version() -> None:
    """Outside the view nothing changed: a hybrid or v1 machine stays on v1, where its freezer is."""
    layout = cgroups.detect()
    h = cgroups.hierarchy()
    if layout.v1("freezer") is not None:
        assert isinstance(h, cgroups.V1) and h.freezer == layout.v1("freezer")
    else:
        assert isinstance(h, cgroups.V2)


# --------------------------------------------------------------------------- one group


class NoKillFile(cgroups.GroupV2):
    """A group as on a kernel before 5.14, which has no ``cgroup.kill``."""

    @property
    def has_kill(self) -> bool:
        return False


def _forking_loop(group: cgroups.Cgroup, counter: Path) -> int:
    """A shell that forks a ``sleep`` every 10 ms and appends to ``counter``, started in ``group``; its pid."""
    proc = subprocess.Popen(["sh", "-c", f"while :; do echo x >> {counter}; sleep 0.01; done"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    group.add(proc.pid)
    return proc.pid


def _count(counter: Path) -> int:
    return counter.stat().st_size if counter.exists() else 0


def _dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def in_view_freeze_thaw_members_kill(tmp: str) -> None:
    h = cgroups.hierarchy()
    node = f"grp-{os.getpid()}"
    for cls in (cgroups.GroupV2, NoKillFile):
        group = cls(h.rank(node, f"r-{cls.__name__}").path)
        group.create()
        counter = Path(tmp) / f"count-{cls.__name__}"
        sh = _forking_loop(group, counter)
        # Children forked by a member are born in the group.
        wait_until(lambda g=group, p=sh: len(g.procs()) >= 2 and p in g.procs(), timeout=5,
                   what="the shell's children in its group", interval=0.002)
        assert _cgroup_of(sh) == f"/tidal/{node}/r-{cls.__name__}"
        group.freeze()
        assert group.frozen() and "frozen 1" in (group.path / "cgroup.events").read_text()
        frozen_at = _count(counter)
        time.sleep(0.3)
        assert _count(counter) == frozen_at, "a frozen group went on running"
        group.thaw()
        assert not group.frozen()
        wait_until(lambda c=counter, n=frozen_at: _count(c) > n + 6, timeout=5, what="the shell after the thaw")
        group.freeze()  # killed while frozen, as fencing does
        members = group.procs()
        killed = group.kill()
        assert sh in killed and set(members) <= set(killed), (members, killed)
        assert group.wait_empty(10), group.procs()
        wait_until(lambda p=sh: _dead(p), timeout=5, what="the shell to die")
        group.remove()
        assert not group.path.exists()
    h.node_path(node).rmdir()
    print("cgroup.kill on this kernel:", "cgroup.kill" in cgroups.v2_core_features(Path("/sys/fs/cgroup")),
          flush=True)


def test_a_group_freezes_thaws_keeps_its_children_and_is_killed_as_one(tmp_path: Path) -> None:
    run_in_v2_view(in_view_freeze_thaw_members_kill, tmp_path)


# --------------------------------------------------------------------------- ranks under CRIU


def in_view_rank_checkpoint_restore(tmp: str) -> None:
    root = Path(tmp)
    work = root / "work"
    work.mkdir()
    store = CheckpointStore(str(root / "store"))
    spec = RankSpec("job", 0, tuple(LOOP), work, _env())
    ref = reference_run(LOOP, root / "ref", spec.launch_env())
    a, b = _node(root, "a"), _node(root, "b")
    runner = RecordingRunner()
    job = Job.launch("job", [(spec, a)], store, runner=runner)
    rank = job.ranks[0]
    assert _cgroup_of(rank.pid) == f"/tidal/{a.name}/{spec.name}"
    wait_for_line(a.log_path(spec), r"^tick 10$")
    job.checkpoint(then="hold")  # frozen through cgroup.freeze, dumped, and left frozen
    assert rank.cgroup.frozen() and "frozen 1" in (rank.cgroup.path / "cgroup.events").read_text()
    held = a.log_path(spec).stat().st_size
    time.sleep(0.2)
    assert a.log_path(spec).stat().st_size == held, "a held rank went on writing"
    job.release()
    wait_for_line(a.log_path(spec), r"^tick 20$")
    job.checkpoint(then="kill")
    for freezer, log in runner.dumps:
        assert freezer == Path("/sys/fs/cgroup/tidal") / a.name / spec.name
        assert "Detected cgroup V2 freezer" in log, log[-2000:]
    job = Job.restore(store, "job", [(spec, b)])
    restored = job.ranks[0]
    assert _cgroup_of(restored.pid) == f"/tidal/{b.name}/{spec.name}"
    assert [s.code for s in job.wait(60)] == [0]
    assert b.log_path(spec).read_bytes() == ref
    assert not restored.cgroup.path.exists()  # removed once its rank ended
    _remove_node_groups(a, b)


def test_a_rank_is_frozen_dumped_and_restored_through_cgroup2(tmp_path: Path) -> None:
    run_in_v2_view(in_view_rank_checkpoint_restore, tmp_path)


def in_view_placed_rank_and_fencing(tmp: str) -> None:
    """A rank moved below a device's group (what a CPU quota does on v2; the move needs no controller) is
    frozen and dumped there; a new agent fences it when it is left frozen, and also one not placed."""
    from tidal.agent.fencing import reap_leftovers

    root = Path(tmp)
    work = root / "work"
    work.mkdir()
    store = CheckpointStore(str(root / "store"))
    node = _node(root, "fence")
    h = cgroups.hierarchy()
    loop = ("sh", "-c", "while :; do sleep 0.01; done")
    placed_spec = RankSpec("placed", 0, loop, work, _env())
    loose_spec = RankSpec("loose", 0, loop, work, _env())
    runner = RecordingRunner()
    placed = Job.launch("placed", [(placed_spec, node)], store, runner=runner)
    loose = Job.launch("loose", [(loose_spec, node)], store)
    rank = placed.ranks[0]
    sh = wait_until(lambda: [p for p in rank.pids() if p != rank.pid], timeout=10, what="the command")[0]
    h.device_path(node.name, 1).mkdir(parents=True)
    old = rank.cgroup.path
    rank.cgroup = h.place(node.name, 1, rank.cgroup, rank.pid)
    assert rank.cgroup.path == h.device_path(node.name, 1) / placed_spec.name and not old.exists()
    # The rank's init and its shell (the loop's `sleep`s come and go: an exiting one reads otherwise).
    for p in (rank.pid, sh):
        assert _cgroup_of(p) == f"/tidal/{node.name}/dev1/{placed_spec.name}"
    placed.checkpoint(then="continue")
    assert runner.dumps[-1][0] == rank.cgroup.path and "Detected cgroup V2 freezer" in runner.dumps[-1][1]
    assert not rank.cgroup.frozen()
    # The agent dies while the ranks are frozen for a dump: only a new agent's fencing takes them down.
    rank.cgroup.freeze()
    loose.ranks[0].cgroup.freeze()
    groups = {str(g.path) for g in h.rank_groups(node.name)}
    assert groups == {str(rank.cgroup.path), str(loose.ranks[0].cgroup.path)}, groups
    killed = reap_leftovers(node.name)
    assert {rank.pid, sh, loose.ranks[0].pid} <= set(killed), killed
    assert rank.wait(10).signal == 9 and loose.ranks[0].wait(10).signal == 9
    assert h.members(node.name) == [] and reap_leftovers(node.name) == []
    assert h.device_path(node.name, 1).is_dir()  # a device's group stays: its quota is the agent's
    h.device_path(node.name, 1).rmdir()
    _remove_node_groups(node)


def test_a_rank_below_a_device_group_is_dumped_and_fenced(tmp_path: Path) -> None:
    run_in_v2_view(in_view_placed_rank_and_fencing, tmp_path)


def in_view_restore_then_dump(tmp: str, spec_dir: str) -> None:
    """Half of the v1 → v2 → v1 migration: restore what a v1 host dumped, run, dump again."""
    root = Path(tmp)
    spec = RankSpec("job", 0, tuple(LOOP), Path(spec_dir), _env())
    node = _node(root, "v2")
    job = Job.restore(CheckpointStore(str(root / "store")), "job", [(spec, node)])
    assert _cgroup_of(job.ranks[0].pid) == f"/tidal/{node.name}/{spec.name}"
    wait_for_line(node.log_path(spec), r"^tick 30$")
    job.checkpoint(then="kill")
    assert [s.signal for s in job.wait(30)] == [9]  # reaped: its group is gone before this process ends
    _remove_node_groups(node)


def test_a_checkpoint_moves_between_a_v1_and_a_cgroup2_host(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    store = CheckpointStore(str(tmp_path / "store"))
    spec = RankSpec("job", 0, tuple(LOOP), work, _env())
    ref = reference_run(LOOP, tmp_path / "ref", spec.launch_env())
    first, last = _node(tmp_path, "first"), _node(tmp_path, "last")
    job = Job.launch("job", [(spec, first)], store)
    wait_for_line(first.log_path(spec), r"^tick 10$")
    job.checkpoint(then="kill")
    run_in_v2_view(in_view_restore_then_dump, tmp_path, work)
    job = Job.restore(store, "job", [(spec, last)])
    assert [s.code for s in job.wait(60)] == [0]
    assert last.log_path(spec).read_bytes() == ref
    _remove_node_groups(first, last)


# --------------------------------------------------------------------------- CPU devices


def in_view_cpu_quota(tmp: str) -> None:
    from tidal.agent.devices import CpuQuota

    h = cgroups.hierarchy()
    offered = h.cpu_controllers()
    if "cpu" not in offered:
        held = sorted(c for c in ("cpu", "cpuset") if c not in offered)
        skip(f"this machine's cgroup2 offers no {', '.join(held)} controller (cgroup.controllers: "
             f"{' '.join(sorted(cgroups.v2_controllers(Path('/sys/fs/cgroup')))) or 'none'}): they are bound to its "
             "cgroup v1 hierarchies, so cpu.max and cpuset.cpus cannot be tried here")
    root = Path(tmp)
    work = root / "work"
    work.mkdir()
    store = CheckpointStore(str(root / "store"))
    node = f"quota-{os.getpid()}"
    quota = CpuQuota(node, devices=4, cores=1, cpus=[[0]] * 4)  # a quarter of a CPU per device
    assert quota.enabled
    assert (quota.path(2) / "cpu.max").read_text().split() == ["25000", "100000"]
    spec = RankSpec("q", 0, ("sh", "-c", "while :; do :; done"), work, _env(), cpus=(0,))
    job = Job.launch("q", [(spec, NodeRoot(node, root / "a"))], store)
    try:
        quota.place(2, job.ranks[0])
        busy = wait_until(lambda: [p for p in job.ranks[0].pids() if p != job.ranks[0].pid], timeout=10,
                          what="the busy loop")[0]
        assert _cgroup_of(busy) == f"/tidal/{node}/dev2/{spec.name}"
        c0, t0 = _cpu_seconds(busy), time.monotonic()
        time.sleep(1.0)
        share = (_cpu_seconds(busy) - c0) / (time.monotonic() - t0)
        assert share < 0.4, share  # ≈ 0.25 of a CPU, not a whole one
        job.checkpoint("kill")
        job = Job.restore(store, "q", [(spec, NodeRoot(node, root / "b"))])
        quota.place(2, job.ranks[0])
        assert _cgroup_of(job.ranks[0].pid) == f"/tidal/{node}/dev2/{spec.name}"
    finally:
        job.kill()
    for i in range(4):
        wait_until(lambda p=quota.path(i): p.rmdir() is None, timeout=5, what=f"{quota.path(i)} to be removable")
    quota.base.rmdir()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cpu_quota_caps_a_rank_on_cgroup2(tmp_path: Path) -> None:
    run_in_v2_view(in_view_cpu_quota, tmp_path)
