"""Which cgroup version Tidal uses, read from mountinfo texts of v1-only, hybrid and v2-only hosts; and the
files a cgroup2 device group gets, written into a stand-in tree."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.unit.mechanisms.criu import mountinfo as mi
from tidal.errors import MechanismError
from tidal.mechanisms.criu import cgroups
from tidal.mechanisms.criu.cgroups import V1, V2, CgroupMount, detect, from_layout, parse_mountinfo

CG = Path("/sys/fs/cgroup")


def test_v1_only() -> None:
    layout = detect(mi.V1_ONLY, mi.FILESYSTEMS)
    assert (layout.mode, layout.version, layout.v2) == ("v1", 1, None)
    assert layout.v1("freezer") == CG / "freezer"
    assert layout.v1("cpu") == layout.v1("cpuacct") == CG / "cpu,cpuacct"
    assert layout.v1("cpuset") == CG / "cpuset"
    # Mount options are not controllers; a named hierarchy is kept by its name.
    assert set(layout.v1_controllers) == {"name=systemd", "cpu", "cpuacct", "freezer", "cpuset", "memory"}
    h = from_layout(layout)
    assert isinstance(h, V1) and h.freezer == CG / "freezer" and h.cpu == CG / "cpu,cpuacct"
    assert h.rank("node-1", "job.r0").path == CG / "freezer/tidal/node-1/job.r0"
    assert h.rank("node-1", "job.r0", device=3).path == CG / "freezer/tidal/node-1/job.r0"  # v1: separate
    assert h.device_path("node-1", 3) == CG / "cpu,cpuacct/tidal-devices/node-1/dev3"


def test_hybrid_stays_on_v1() -> None:
    """This machine: v1 controllers beside an empty cgroup2 hierarchy. Tidal keeps to v1's freezer."""
    layout = detect(mi.HYBRID, mi.FILESYSTEMS)
    assert (layout.mode, layout.version) == ("hybrid", 1)
    assert layout.v2 == CG / "unified"
    assert layout.v1("freezer") == CG / "freezer" and layout.v1("cpu") == CG / "cpu"
    assert isinstance(from_layout(layout), V1)


def test_hybrid_without_a_v1_freezer_freezes_through_cgroup2() -> None:
    layout = detect(mi.HYBRID_NO_V1_FREEZER, mi.FILESYSTEMS)
    assert (layout.mode, layout.version, layout.v2) == ("hybrid", 2, CG / "unified")
    h = from_layout(layout)
    assert isinstance(h, V2) and h.mount == CG / "unified"


def test_v2_only() -> None:
    layout = detect(mi.V2_ONLY, mi.FILESYSTEMS)
    assert (layout.mode, layout.version, layout.v2) == ("v2", 2, CG)
    assert layout.v1_controllers == {} and layout.v1("freezer") is None
    h = from_layout(layout)
    assert isinstance(h, V2)
    assert h.rank("node-1", "job.r0").path == CG / "tidal/node-1/job.r0"
    # Under a device's quota a rank lives below the device's group: a process is in one cgroup2 group only.
    assert h.rank("node-1", "job.r0", device=3).path == CG / "tidal/node-1/dev3/job.r0"
    assert h.device_path("node-1", 3) == CG / "tidal/node-1/dev3"


def test_the_hierarchys_root_is_preferred_to_a_bind_mount_of_a_group() -> None:
    mounts = parse_mountinfo(mi.V2_WITH_BIND)
    assert mounts == [CgroupMount(2, Path("/var/lib/my pods/cg"), "/kubepods/pod1"), CgroupMount(2, CG, "/")]
    assert detect(mi.V2_WITH_BIND, mi.FILESYSTEMS).v2 == CG


def test_no_cgroups() -> None:
    layout = detect(mi.NONE, mi.FILESYSTEMS_NO_V2)
    assert (layout.mode, layout.version, layout.cgroup2_in_kernel) == ("none", None, False)
    assert detect(mi.NONE, mi.FILESYSTEMS).cgroup2_in_kernel
    assert from_layout(layout) is None


def test_no_hierarchy_is_an_error_that_says_what_to_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "current", lambda: None)
    with pytest.raises(MechanismError) as e:
        cgroups.hierarchy()
    assert "mount -t cgroup2" in (e.value.hint or "")


def _fake_v2(root: Path, controllers: str) -> None:
    """The files the kernel would show at a cgroup2 mount (a plain directory stands in)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("\n")


def test_v2_device_group_gets_cpu_max_and_cpuset(tmp_path: Path) -> None:
    _fake_v2(tmp_path, "cpuset cpu io memory pids")
    _fake_v2(tmp_path / "tidal", "cpuset cpu io memory pids")
    _fake_v2(tmp_path / "tidal" / "n1", "cpuset cpu io memory pids")
    h = V2(tmp_path)
    assert h.cpu_controllers() == {"cpu", "cpuset"}
    h.confine_device("n1", 2, 0.25, [1])
    for group in (tmp_path, tmp_path / "tidal", tmp_path / "tidal" / "n1"):  # enabled down to the device
        assert (group / "cgroup.subtree_control").read_text() == "+cpu +cpuset"
    dev = tmp_path / "tidal" / "n1" / "dev2"
    assert (dev / "cpu.max").read_text() == "25000 100000"
    assert (dev / "cpuset.cpus").read_text() == "1"


def test_v2_device_group_without_cpuset(tmp_path: Path) -> None:
    _fake_v2(tmp_path, "cpu memory")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")  # already enabled at the root
    _fake_v2(tmp_path / "tidal", "cpu memory")
    _fake_v2(tmp_path / "tidal" / "n1", "cpu memory")
    h = V2(tmp_path)
    h.confine_device("n1", 0, 1.5, [0, 1])
    assert (tmp_path / "cgroup.subtree_control").read_text() == "cpu memory\n"  # not written again
    assert (tmp_path / "tidal" / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "tidal" / "n1" / "dev0" / "cpu.max").read_text() == "150000 100000"
    assert not (tmp_path / "tidal" / "n1" / "dev0" / "cpuset.cpus").exists()


def test_v2_without_the_cpu_controller_refuses_a_quota(tmp_path: Path) -> None:
    _fake_v2(tmp_path, "hugetlb")  # this machine's unified hierarchy: v1 holds cpu and cpuset
    h = V2(tmp_path)
    assert h.cpu_controllers() == frozenset()
    with pytest.raises(MechanismError, match="no cpu controller"):
        h.confine_device("n1", 0, 0.5)


def test_v2_rank_groups_include_those_below_devices(tmp_path: Path) -> None:
    h = V2(tmp_path)
    for p in ("tidal/n1/job.r0", "tidal/n1/dev1/job.r1", "tidal/n1/dev1/other.r0", "tidal/n1/dev2", "tidal/n2/x"):
        (tmp_path / p).mkdir(parents=True)
    (tmp_path / "tidal" / "n1" / "cgroup.procs").touch()  # files are not groups
    assert [g.path.relative_to(tmp_path / "tidal" / "n1").as_posix() for g in h.rank_groups("n1")] == [
        "dev1/job.r1", "dev1/other.r0", "job.r0"]
    assert h.rank_groups("absent") == []


def test_v1_rank_groups(tmp_path: Path) -> None:
    layout = cgroups.Layout((CgroupMount(1, tmp_path / "freezer", "/", frozenset({"freezer"})),))
    h = from_layout(layout)
    assert isinstance(h, V1) and h.cpu is None and h.cpu_controllers() == frozenset()
    for p in ("tidal/n1/job.r0", "tidal/n1/job.r1"):
        (tmp_path / "freezer" / p).mkdir(parents=True)
    assert [g.path.name for g in h.rank_groups("n1")] == ["job.r0", "job.r1"]
    with pytest.raises(MechanismError, match="cpu controller"):
        h.device_path("n1", 0)


def test_a_group_removed_while_its_processes_are_read_is_empty(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A group removed between the open of its cgroup.procs and the read (its last process ended, and its
    owner removed it) reads ENODEV: it holds nothing, and a fence waiting for it to empty is done (seen once
    when a new agent fenced the ranks of a dead one). Any other error stays an error."""
    h = V2(tmp_path)
    (tmp_path / "tidal" / "n1" / "job.r0").mkdir(parents=True)
    (group,) = h.rank_groups("n1")
    procs = group.path / "cgroup.procs"
    procs.write_text("41\n42\n")
    assert group.procs() == [41, 42]
    real = Path.read_text
    error = {"errno": errno.ENODEV}

    def read_text(self: Path, *args: object, **kw: object) -> str:
        if self == procs:
            raise OSError(error["errno"], os.strerror(error["errno"]))
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    assert group.procs() == []
    assert group.wait_empty(1.0) is True
    error["errno"] = errno.EACCES
    with pytest.raises(PermissionError):
        group.procs()
