"""The cgroups a rank lives in, on whichever cgroup version the host mounts.

Tidal does four things with cgroups: it keeps a rank's processes together in one group per rank
incarnation, holds that group still across a dump (freeze, thaw, wait for the state), kills every member of
it (fencing a dead agent's left-overs), and gives a virtual CPU device its share of the machine (a CPU quota
and a CPU set per device, where devices share cores). :class:`Hierarchy` and :class:`Cgroup` are those
operations; :class:`V1` and :class:`V2` implement them.

Which one a host gets is read from ``/proc/self/mountinfo`` and ``/proc/filesystems`` (:func:`detect`):

* **v1** where a v1 hierarchy with the ``freezer`` controller is mounted: legacy hosts, and hybrid ones
  that mount v1 controllers beside an (empty) cgroup2 hierarchy, such as ``/sys/fs/cgroup/unified``.
  A controller bound to a v1 hierarchy cannot be enabled in cgroup2, so Tidal stays with v1 there.
  Rank groups: ``<freezer>/tidal/<node>/<rank>``; device quotas: ``<cpu>/tidal-devices/<node>/dev<i>``
  (``cpu.cfs_quota_us``); a device's CPU set is the ranks' CPU affinity.
* **v2** where no v1 freezer is mounted and cgroup2 is (unified hosts: current Ubuntu, RHEL, Kubernetes
  nodes). The freezer is ``cgroup.freeze`` (state in ``cgroup.events``), a kill is ``cgroup.kill`` where the
  kernel has it (Linux ≥ 5.14; else the listed members are killed until none is left). Both are core
  cgroup2 features that need no controller. Unlike a v1-frozen task, a cgroup2-frozen one dies on SIGKILL at
  once, so a killed rank's group may be gone by the time it is thawed (a thaw of a gone group does nothing).
  A process is in one cgroup2 group only, so a rank under a
  device's quota lives *below* the device: ``tidal/<node>/dev<i>/<rank>``, the device group holding
  ``cpu.max`` and ``cpuset.cpus``, with the ``cpu`` (and ``cpuset``) controllers enabled down to it
  through ``cgroup.subtree_control``; a rank not under a quota lives at ``tidal/<node>/<rank>``.

CRIU is told the rank's group with ``--freeze-cgroup`` on both: CRIU 4.1 recognises a cgroup2 path itself
("Detected cgroup V2 freezer" in its log) and leaves the group frozen, as it found it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Literal

from tidal.errors import MechanismError
from tidal.mechanisms.criu import tasks

log = logging.getLogger(__name__)

Version = Literal[1, 2]
PERIOD_US = 100_000  # the CPU quota's period
BASE = "tidal"  # rank groups (v1: in the freezer hierarchy; v2: the whole of Tidal's tree)
V1_DEVICES = "tidal-devices"  # device quotas in the v1 cpu hierarchy
DEVICE = re.compile(r"dev\d+")  # a device's group below a node's (v2), as :meth:`Hierarchy.device_path` names it

# Mount and super options of a v1 cgroup mount that are not controllers.
_NOT_CONTROLLERS = {"rw", "ro", "noprefix", "clone_children", "xattr", "cpuset_v2_mode", "favordynmods"}


# --------------------------------------------------------------------------- what the host mounts


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup mount of this mount namespace."""

    version: Version
    point: Path
    root: str = "/"  # the hierarchy's group seen at ``point`` ("/" unless bind-mounted or in a cgroup namespace)
    controllers: frozenset[str] = frozenset()  # v1: the controllers (and name=...) bound to it; v2: see V2


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts listed in a ``/proc/PID/mountinfo`` text, in its order."""
    out: list[CgroupMount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        fstype, super_opts = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if fstype == "cgroup2":
            out.append(CgroupMount(2, point, root))
        elif fstype == "cgroup":
            names = frozenset(o for o in super_opts.split(",")
                              if o and o not in _NOT_CONTROLLERS and ("=" not in o or o.startswith("name=")))
            out.append(CgroupMount(1, point, root, names))
    return out


@dataclass(frozen=True)
class Layout:
    """The cgroup mounts of this mount namespace and whether the kernel has cgroup2 at all."""

    mounts: tuple[CgroupMount, ...]
    cgroup2_in_kernel: bool = True

    def v1(self, controller: str) -> Path | None:
        """Where the v1 hierarchy holding ``controller`` is mounted (its first mount)."""
        for m in self.mounts:
            if m.version == 1 and controller in m.controllers:
                return m.point
        return None

    @property
    def v2(self) -> Path | None:
        """The cgroup2 mount to use: of the hierarchy's own root where there is one, the shortest path."""
        found = [m for m in self.mounts if m.version == 2]
        found.sort(key=lambda m: (m.root != "/", len(m.point.parts)))
        return found[0].point if found else None

    @property
    def v1_controllers(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for m in self.mounts:
            if m.version == 1:
                for c in sorted(m.controllers):
                    out.setdefault(c, m.point)
        return out

    @property
    def mode(self) -> Literal["v1", "hybrid", "v2", "none"]:
        """How the host mounts cgroups: v1 controllers only, v1 beside cgroup2, cgroup2 only, none."""
        v1 = any(m.version == 1 and any(not c.startswith("name=") for c in m.controllers) for m in self.mounts)
        v2 = self.v2 is not None
        return "hybrid" if v1 and v2 else "v1" if v1 else "v2" if v2 else "none"

    @property
    def version(self) -> Version | None:
        """The version Tidal uses: v1 where a v1 freezer is mounted, else v2 where cgroup2 is, else none."""
        if self.v1("freezer") is not None:
            return 1
        if self.v2 is not None:
            return 2
        return None


def detect(mountinfo: str | None = None, filesystems: str | None = None) -> Layout:
    """This process's cgroup layout (or the one the given texts describe)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if filesystems is None:
        try:
            filesystems = Path("/proc/filesystems").read_text()
        except OSError:
            filesystems = ""
    in_kernel = any(line.split()[-1:] == ["cgroup2"] for line in filesystems.splitlines())
    return Layout(tuple(parse_mountinfo(mountinfo)), in_kernel)


def v2_controllers(point: Path) -> frozenset[str]:
    """The controllers a cgroup2 hierarchy offers at its mount (none where v1 hierarchies hold them)."""
    try:
        return frozenset((point / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()


def v1_bound(proc_cgroups: str | None = None) -> frozenset[str]:
    """The controllers bound to a v1 hierarchy anywhere on the machine (a non-zero hierarchy id in
    ``/proc/cgroups``, whatever this mount namespace shows): cgroup2 cannot have those."""
    if proc_cgroups is None:
        try:
            proc_cgroups = Path("/proc/cgroups").read_text()
        except OSError:
            return frozenset()
    out = set()
    for line in proc_cgroups.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.startswith("#") and fields[1].isdigit() and int(fields[1]) != 0:
            out.add(fields[0])
    return frozenset(out)


def v2_core_features(point: Path) -> frozenset[str]:
    """Which of ``cgroup.freeze`` and ``cgroup.kill`` a cgroup2 group has here: tried on a fresh group below
    ``point`` (the hierarchy's root has neither), removed again. Needs root."""
    probe = point / f"tidal-probe-{os.getpid()}-{time.monotonic_ns()}"
    probe.mkdir()
    try:
        return frozenset(f for f in ("cgroup.freeze", "cgroup.kill") if (probe / f).exists())
    finally:
        probe.rmdir()


# --------------------------------------------------------------------------- one group


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:  # one write(2): a cgroup file takes a value per write
        f.write(text)


def _write_if_there(path: Path, text: str) -> None:
    """Write, unless the group is gone: removed (ENOENT), or being removed while the file opens (ENODEV), as
    when its last process has just died and its owner took it away."""
    try:
        _write(path, text)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENODEV):
            raise


def _unfrozen(pids: Sequence[int]) -> str:
    """The tasks not (yet) frozen, with their state and kernel wait channel (v1: ``refrigerator``, v2:
    ``do_freezer_trap``)."""
    out = []
    for pid in pids:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if "refrigerator" in wchan or "freezer" in wchan:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state = stat[stat.rindex(")") + 2]
        out.append(f"{pid} {comm} {state} {wchan or '-'}")
    return "; ".join(out) or "none listed"


class Cgroup(ABC):
    """One rank incarnation's group of processes. ``path`` is what CRIU's ``--freeze-cgroup`` gets."""

    version: ClassVar[Version]

    def __init__(self, path: Path) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def create(self) -> None:
        """Make the group, or take over an empty left-over of a killed incarnation (thawed). A left-over that
        still holds processes is refused: two copies of one rank would mix."""
        if self.path.exists():
            if self.procs():
                raise MechanismError(f"cgroup {self.path} still holds processes {self.procs()}",
                                     hint="another copy of this rank is running on this node")
            self.thaw()
        else:
            self.path.mkdir(parents=True)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group; its later children are born in it."""
        _write(self.path / "cgroup.procs", str(pid))

    def procs(self) -> list[int]:
        """The processes in the group (an empty list when it does not exist)."""
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # removed between the open and the read (its last process ended)
                return []
            raise

    def freeze(self, timeout: float = 20.0, attempts: int = 4) -> None:
        """Freeze every task and wait until the kernel says the group is frozen. A task in a sleep the
        freezer cannot interrupt (writeback throttling on a busy disk, the middle of an exit) holds the group
        half-frozen: thaw, let it get past, try again."""
        per_try = timeout / attempts
        stuck = "none listed"
        for attempt in range(attempts):
            self._request_freeze()
            if self._await_frozen(time.monotonic() + per_try):
                return
            stuck = _unfrozen(self.procs())
            self.thaw()
            if attempt < attempts - 1:
                time.sleep(0.1 * (attempt + 1))
        raise MechanismError(f"rank did not freeze within {timeout:.0f}s ({self.path}); not frozen: {stuck}",
                             hint="a process of the rank is stuck in uninterruptible sleep")

    @abstractmethod
    def _request_freeze(self) -> None: ...

    @abstractmethod
    def _await_frozen(self, deadline: float) -> bool: ...

    @abstractmethod
    def frozen(self) -> bool:
        """Whether the kernel reports the whole group frozen."""

    @abstractmethod
    def thaw(self) -> None:
        """Let the group run again; nothing to do where it is gone (its processes ended)."""

    def kill(self) -> list[int]:
        """SIGKILL every member, also frozen ones (thawed, so that the kill lands); the pids listed."""
        pids = self.procs()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.thaw()
        return pids

    def wait_empty(self, timeout: float) -> bool:
        """Wait until no process is left in the group; False if some still are after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.procs():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def remove(self) -> None:
        """Remove the group; one still holding (exiting) processes is left: :meth:`create` checks it."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


class FreezerV1(Cgroup):
    """A group of the v1 freezer hierarchy: ``freezer.state`` is FROZEN, FREEZING or THAWED."""

    version = 1

    def state(self) -> str:
        return (self.path / "freezer.state").read_text().strip()

    def frozen(self) -> bool:
        return self.state() == "FROZEN"

    def _request_freeze(self) -> None:
        _write(self.path / "freezer.state", "FROZEN")

    def _await_frozen(self, deadline: float) -> bool:
        while self.state() != "FROZEN":
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def thaw(self) -> None:
        _write_if_there(self.path / "freezer.state", "THAWED")


class GroupV2(Cgroup):
    """A cgroup2 group: ``cgroup.freeze`` asks, ``cgroup.events`` says ("frozen 1"), ``cgroup.kill`` kills."""

    version = 2

    def events(self) -> dict[str, str]:
        text = (self.path / "cgroup.events").read_text()
        return dict(line.split(None, 1) for line in text.splitlines() if " " in line)

    def frozen(self) -> bool:
        return self.events().get("frozen") == "1"

    def _request_freeze(self) -> None:
        try:
            _write(self.path / "cgroup.freeze", "1")
        except FileNotFoundError:
            if not self.path.is_dir():
                raise
            raise MechanismError(f"{self.path} has no cgroup.freeze: this kernel's cgroup2 cannot freeze",
                                 hint="Tidal needs Linux ≥ 5.2 on a cgroup2 host; see `tidal doctor`") from None

    def _await_frozen(self, deadline: float) -> bool:
        """Wait on ``cgroup.events`` (the kernel notifies a change with POLLPRI) until it says frozen."""
        with open(self.path / "cgroup.events", "rb", buffering=0) as f:
            poller = select.poll()
            poller.register(f.fileno(), select.POLLPRI | select.POLLERR)
            while True:
                f.seek(0)
                if b"frozen 1" in f.read():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # Short slices: a change that lands between the read and the poll is seen at the next one.
                poller.poll(min(left, 0.05) * 1000)

    def thaw(self) -> None:
        _write_if_there(self.path / "cgroup.freeze", "0")

    @property
    def has_kill(self) -> bool:
        """Whether the kernel offers ``cgroup.kill`` (Linux ≥ 5.14)."""
        return (self.path / "cgroup.kill").exists()

    def kill(self) -> list[int]:
        """``cgroup.kill`` kills the whole group at once, frozen or not, and a process forking meanwhile cannot
        escape it; without it, the listed members are killed until none is left."""
        pids = self.procs()
        if self.has_kill:
            _write_if_there(self.path / "cgroup.kill", "1")
            return pids
        seen = set(pids)
        deadline = time.monotonic() + 5.0
        while True:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self.thaw()
            pids = [p for p in self.procs() if p not in seen]
            if not pids or time.monotonic() > deadline:
                return sorted(seen)
            seen.update(pids)


# --------------------------------------------------------------------------- the hierarchy


class Hierarchy(ABC):
    """Tidal's groups on this host: one per rank incarnation, one per CPU device that needs a quota."""

    version: ClassVar[Version]

    @abstractmethod
    def rank(self, node: str, name: str, device: int | None = None) -> Cgroup:
        """Rank ``name``'s group on ``node``; ``device``: the rank is under that device's quota (only v2 puts
        the rank's group below the device's, so only there does the path depend on it)."""

    @abstractmethod
    def node_path(self, node: str) -> Path:
        """The directory that holds ``node``'s rank groups."""

    def rank_groups(self, node: str) -> list[Cgroup]:
        """Every rank group of ``node`` (also those of earlier agents, for fencing)."""
        base = self.node_path(node)
        if not base.is_dir():
            return []
        return [self._group(p) for p in sorted(base.iterdir()) if p.is_dir()]

    @abstractmethod
    def _group(self, path: Path) -> Cgroup: ...

    def members(self, node: str) -> list[int]:
        """Every process in ``node``'s rank groups."""
        return [pid for g in self.rank_groups(node) for pid in g.procs()]

    # -- CPU devices ------------------------------------------------------------------------------
    @abstractmethod
    def cpu_controllers(self) -> frozenset[str]:
        """Which of ``cpu`` (quota) and ``cpuset`` Tidal can use for devices here."""

    @abstractmethod
    def device_path(self, node: str, device: int) -> Path:
        """The group of ``node``'s device ``device`` (the one holding its quota)."""

    @abstractmethod
    def confine_device(self, node: str, device: int, share: float, cpus: Sequence[int] | None = None) -> None:
        """Make device ``device``'s group: ``share`` of a CPU (a quota per period) and, where the hierarchy
        offers it and ``cpus`` are given, that CPU set. Idempotent."""

    @abstractmethod
    def place(self, node: str, device: int, group: Cgroup, root_pid: int) -> Cgroup:
        """Put a running rank (``group``, its init ``root_pid``) under the device's quota; the rank's group
        afterwards (a new one on v2, where the rank's group moves below the device's)."""


class V1(Hierarchy):
    """cgroup v1: the freezer and the cpu controller are separate hierarchies a process is in at once."""

    version = 1

    def __init__(self, layout: Layout) -> None:
        freezer = layout.v1("freezer")
        if freezer is None:
            raise MechanismError("no cgroup v1 freezer is mounted", hint="see `tidal doctor`")
        self.freezer = freezer
        self.cpu = layout.v1("cpu")
        self.cpuset = layout.v1("cpuset")

    def node_path(self, node: str) -> Path:
        return self.freezer / BASE / node

    def rank(self, node: str, name: str, device: int | None = None) -> Cgroup:
        return FreezerV1(self.node_path(node) / name)

    def _group(self, path: Path) -> Cgroup:
        return FreezerV1(path)

    def cpu_controllers(self) -> frozenset[str]:
        # The CPU set of a device is the ranks' affinity on v1 (see tidal.agent.devices): only the quota is
        # a cgroup.
        return frozenset({"cpu"}) if self.cpu is not None and (self.cpu / "cgroup.procs").exists() else frozenset()

    def device_path(self, node: str, device: int) -> Path:
        if self.cpu is None:
            raise MechanismError("no cgroup v1 cpu controller is mounted", hint="see `tidal doctor`")
        return self.cpu / V1_DEVICES / node / f"dev{device}"

    def confine_device(self, node: str, device: int, share: float, cpus: Sequence[int] | None = None) -> None:
        d = self.device_path(node, device)
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "cpu.cfs_period_us", str(PERIOD_US))
        _write(d / "cpu.cfs_quota_us", str(int(share * PERIOD_US)))

    def place(self, node: str, device: int, group: Cgroup, root_pid: int) -> Cgroup:
        """Every process of the rank (its init and all below it; threads follow their process) joins the
        device's cpu group too; children it forks later inherit it."""
        procs = self.device_path(node, device) / "cgroup.procs"
        placed: set[int] = set()
        while True:  # a process forked by one not moved yet stays behind: list again until none is new
            new = [pid for pid in tasks.descendants(root_pid) if pid not in placed]
            if not new:
                return group
            for pid in new:
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    _write(procs, str(pid))
                placed.add(pid)


class V2(Hierarchy):
    """cgroup2: one tree. ``<mount>/tidal/<node>/<rank>``, or ``<mount>/tidal/<node>/dev<i>/<rank>`` for a
    rank under device ``i``'s quota."""

    version = 2

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.base = mount / BASE

    def node_path(self, node: str) -> Path:
        return self.base / node

    def rank(self, node: str, name: str, device: int | None = None) -> Cgroup:
        if device is None:
            return GroupV2(self.node_path(node) / name)
        return GroupV2(self.device_path(node, device) / name)

    def _group(self, path: Path) -> Cgroup:
        return GroupV2(path)

    def rank_groups(self, node: str) -> list[Cgroup]:
        """The node's rank groups, also those below its device groups (which are not rank groups)."""
        out: list[Cgroup] = []
        base = self.node_path(node)
        if not base.is_dir():
            return out
        for p in sorted(base.iterdir()):
            if not p.is_dir():
                continue
            if DEVICE.fullmatch(p.name):
                out += [GroupV2(r) for r in sorted(p.iterdir()) if r.is_dir()]
            else:
                out.append(GroupV2(p))
        return out

    def cpu_controllers(self) -> frozenset[str]:
        return v2_controllers(self.mount) & {"cpu", "cpuset"}

    def device_path(self, node: str, device: int) -> Path:
        return self.node_path(node) / f"dev{device}"

    def _enable(self, group: Path, controllers: set[str]) -> None:
        """Enable ``controllers`` for ``group``'s children (``cgroup.subtree_control``)."""
        have = set((group / "cgroup.subtree_control").read_text().split())
        missing = sorted(controllers - have)
        if missing:
            try:
                _write(group / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
            except OSError as exc:
                hint = ("a group that holds processes cannot hand controllers to its children: run the agent "
                        "where Tidal's tree can get them" if exc.errno == errno.EBUSY else "see `tidal doctor`")
                raise MechanismError(f"cannot enable {', '.join(missing)} in {group}: {exc.strerror}",
                                     hint=hint) from exc

    def confine_device(self, node: str, device: int, share: float, cpus: Sequence[int] | None = None) -> None:
        offered = self.cpu_controllers()
        if "cpu" not in offered:
            raise MechanismError(f"the cgroup2 hierarchy at {self.mount} offers no cpu controller",
                                 hint="it is bound to a cgroup v1 hierarchy, or not built; see `tidal doctor`")
        want = {"cpu"} | ({"cpuset"} if cpus and "cpuset" in offered else set())
        node_dir = self.node_path(node)
        node_dir.mkdir(parents=True, exist_ok=True)
        for group in (self.mount, self.base, node_dir):
            self._enable(group, want)
        d = self.device_path(node, device)
        d.mkdir(exist_ok=True)
        _write(d / "cpu.max", f"{max(1000, int(share * PERIOD_US))} {PERIOD_US}")
        if "cpuset" in want and cpus:
            _write(d / "cpuset.cpus", ",".join(str(c) for c in cpus))

    def place(self, node: str, device: int, group: Cgroup, root_pid: int) -> Cgroup:
        """The rank's group moves below the device's: a new group there, every member moved into it (a child
        forked meanwhile is born in the old group: listed again until it is empty), the old one removed."""
        target = self.rank(node, group.path.name, device)
        if target.path == group.path:
            return group
        target.create()
        deadline = time.monotonic() + 10.0
        while pids := group.procs():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    target.add(pid)
            if time.monotonic() > deadline:
                raise MechanismError(f"could not move the rank's processes from {group.path} to {target.path}",
                                     hint=f"still in the old group: {group.procs()}")
        group.remove()
        return target


def from_layout(layout: Layout) -> Hierarchy | None:
    """The hierarchy Tidal uses on a host with this layout (None: no cgroups it can use)."""
    if layout.version == 1:
        return V1(layout)
    if layout.version == 2 and layout.v2 is not None:
        return V2(layout.v2)
    return None


@lru_cache(maxsize=1)
def current() -> Hierarchy | None:
    """This host's hierarchy (detected once per process), or None where no usable cgroup is mounted."""
    h = from_layout(detect())
    if h is not None:
        log.debug("cgroup v%d: %s", h.version, h.node_path("<node>").parent)
    return h


def hierarchy() -> Hierarchy:
    """This host's hierarchy; an error that says what to mount where there is none."""
    h = current()
    if h is None:
        raise MechanismError("no cgroup hierarchy Tidal can use is mounted (neither a cgroup v1 freezer nor "
                             "cgroup2)", hint="mount cgroup2: mount -t cgroup2 none /sys/fs/cgroup; "
                             "see `tidal doctor`")
    return h
