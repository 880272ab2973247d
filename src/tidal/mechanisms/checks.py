"""Can this machine run Tidal's ranks, and what to do where it cannot: the machine's checks behind
``tidal doctor`` (kernel, root, CRIU and its optional features, PID namespaces, cgroups, Python, torch,
the staging tmpfs). The control plane's own checks are in :mod:`tidal.control.checks`; the GPU rows, which
look at the devices an agent would offer, in :mod:`tidal.agent.gpuchecks`.

A check is a plain function returning a :class:`Check` (or a list of them); :func:`run_checks` runs a list
of :class:`Planned` checks in threads, so the whole lot stays well under a few seconds, and turns a check
that crashes into a finding. A check never changes the machine: it looks, or tries something and undoes it.

Nothing here imports torch (the control plane must not need it): torch is looked up with
``importlib.util.find_spec`` and its version read from the package metadata.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from tidal.mechanisms.criu.cgroups import Layout
    from tidal.mechanisms.criu.provision import Criu

Status = Literal["ok", "warn", "missing"]

MIN_KERNEL = (5, 0)
MIN_PYTHON = (3, 11)
MAKE_CRIU = ("run `make criu` (or `python -m tidal.mechanisms.criu.provision`), "
             "or set TIDAL_CRIU to a working criu ≥ 4.0")


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    required: bool = False

    @property
    def failed(self) -> bool:
        """A required check that is missing: makes ``tidal doctor`` exit non-zero."""
        return self.required and self.status == "missing"


class Planned(NamedTuple):
    """A check to run: the row's name and whether it is required (used should the check itself crash)."""

    name: str
    required: bool
    run: Callable[[], Check | list[Check]]


def need(ok: bool, required: bool) -> Status:
    return "ok" if ok else ("missing" if required else "warn")


def run_command(argv: Sequence[str], timeout: float = 10) -> tuple[int, str]:
    """Run a command; (exit code, stdout+stderr). Exit code -1 when it could not run or timed out."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return out.returncode, (out.stdout + out.stderr).strip()


def safe(planned: Planned) -> list[Check]:
    """Run one check; a check that raises is reported as a failed row, not a crash of the doctor."""
    try:
        got = planned.run()
    except Exception as exc:  # a broken check is a finding, not a crash of doctor
        return [Check(planned.name, "missing" if planned.required else "warn",
                      f"check failed: {type(exc).__name__}: {exc}", "report this as a bug in `tidal doctor`",
                      planned.required)]
    return got if isinstance(got, list) else [got]


def run_checks(planned: Sequence[Planned]) -> list[Check]:
    """Every planned check, in the given order; run concurrently (subprocesses dominate)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(safe, p) for p in planned]
        return [c for f in futures for c in f.result()]


# --------------------------------------------------------------------------- the machine


def parse_version(text: str) -> tuple[int, ...] | None:
    """The leading dotted number of a version string: "6.18.44-fc-v657" → (6, 18, 44)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def check_kernel(release: str | None = None, system: str | None = None) -> Check:
    release = platform.release() if release is None else release
    system = platform.system() if system is None else system
    if system != "Linux":
        return Check("kernel", "missing", f"{system} {release}", "Tidal needs Linux (CRIU is Linux-only)",
                     True)
    version = parse_version(release)
    ok = version is not None and version[:2] >= MIN_KERNEL
    return Check("kernel", need(ok, True), f"Linux {release}",
                 "" if ok else "upgrade to a Linux kernel ≥ 5.0", True)


def check_root(euid: int | None = None) -> Check:
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return Check("root", "ok", "running as root (uid 0)", required=True)
    return Check("root", "missing", f"running as uid {euid}; CRIU dumps, CLONE_NEWPID and cgroups need root",
                 "run the Tidal agent (and `tidal doctor`) as root, e.g. with sudo", True)


def check_pid_namespaces(euid: int | None = None) -> Check:
    if not Path("/proc/self/ns/pid").exists():
        return Check("pid namespaces", "missing", "/proc/self/ns/pid does not exist",
                     "use a kernel built with CONFIG_PID_NS", True)
    unshare = shutil.which("unshare")
    if unshare is None:
        return Check("pid namespaces", "warn", "kernel has them; `unshare` not found, so not tried",
                     "install util-linux (provides `unshare`)", True)
    rc, text = run_command([unshare, "--pid", "--fork", "true"], timeout=10)
    if rc == 0:
        return Check("pid namespaces", "ok", "`unshare --pid --fork true` works", required=True)
    euid = os.geteuid() if euid is None else euid
    return Check("pid namespaces", "missing", f"`unshare --pid --fork true` failed: {text or rc}",
                 "run as root" if euid != 0 else "allow CLONE_NEWPID (container: run privileged)", True)


_CGROUP_USE = {
    "freezer": "holds a rank still across a dump",
    "cpu": "CPU quota for CPU devices",
    "cpuset": "CPU sets for CPU devices",
}
_MOUNT_V2 = "mount -t cgroup2 none /sys/fs/cgroup"


def _mount_v1(controller: str) -> str:
    return (f"mkdir -p /sys/fs/cgroup/{controller} && "
            f"mount -t cgroup -o {controller} cgroup /sys/fs/cgroup/{controller}")


def check_cgroups(layout: Layout | None = None, *,
                  features: Callable[[Path], frozenset[str]] | None = None,
                  controllers: Callable[[Path], frozenset[str]] | None = None,
                  bound: Callable[[], frozenset[str]] | None = None) -> list[Check]:
    """Which cgroup version Tidal uses here (see :mod:`tidal.mechanisms.criu.cgroups`), its freezer, and the
    controllers for CPU devices. ``features`` and ``controllers`` (of a cgroup2 mount) and the controllers
    ``bound`` to v1 hierarchies are looked up on the machine unless given: the features by making a probe
    group and removing it again."""
    from tidal.mechanisms.criu import cgroups

    layout = cgroups.detect() if layout is None else layout
    features = features or cgroups.v2_core_features
    controllers = controllers or cgroups.v2_controllers
    bound = bound or cgroups.v1_bound
    version, v2 = layout.version, layout.v2
    if version is None:
        fix = _MOUNT_V2 if layout.cgroup2_in_kernel else _mount_v1("freezer")
        return [Check("cgroups", "missing", "neither a cgroup v1 freezer nor cgroup2 is mounted", fix, True),
                Check("cgroup freezer", "missing", f"none (used for: {_CGROUP_USE['freezer']})", fix, True),
                *[Check(f"cgroup {c}", "warn", f"no cgroups mounted (used for: {_CGROUP_USE[c]})", fix)
                  for c in ("cpu", "cpuset")]]
    if version == 1:
        beside = f"; cgroup2 at {v2} is not used (its controllers are bound to v1)" if v2 else ""
        rows = [Check("cgroups", "ok", f"v1 ({layout.mode}){beside}", required=True)]
        for c, required in (("freezer", True), ("cpu", False), ("cpuset", False)):
            where = layout.v1(c)
            if where:
                rows.append(Check(f"cgroup {c}", "ok", f"v1 at {where}", required=required))
            else:
                rows.append(Check(f"cgroup {c}", need(False, required),
                                  f"cgroup v1 {c} not mounted (used for: {_CGROUP_USE[c]})", _mount_v1(c), required))
        return rows
    assert v2 is not None
    held = sorted(c for c in layout.v1_controllers if not c.startswith("name="))
    beside = f"; v1 holds {', '.join(held)}" if held else ""
    rows = [Check("cgroups", "ok", f"v2 at {v2} ({layout.mode}){beside}", required=True)]
    try:
        have = features(v2)
    except OSError as exc:
        rows.append(Check("cgroup freezer", "missing", f"cannot make a cgroup2 group under {v2}: {exc}",
                          "run Tidal as root, with write access to the cgroup2 hierarchy", True))
    else:
        if "cgroup.freeze" in have:
            kill = "cgroup.kill" if "cgroup.kill" in have else "no cgroup.kill (Linux < 5.14): killed by pid"
            rows.append(Check("cgroup freezer", "ok", f"v2 cgroup.freeze at {v2}; {kill}", required=True))
        else:
            rows.append(Check("cgroup freezer", "missing", f"cgroup2 at {v2} has no cgroup.freeze",
                              "use Linux ≥ 5.2 (the cgroup2 freezer), or mount a v1 freezer: "
                              + _mount_v1("freezer"), True))
    offered = controllers(v2)
    in_v1 = bound() | set(held)
    for c, file in (("cpu", "cpu.max"), ("cpuset", "cpuset.cpus")):
        if c in offered:
            rows.append(Check(f"cgroup {c}", "ok", f"v2 {file} (controller {c} at {v2})"))
        else:
            why = "it is bound to a cgroup v1 hierarchy" if c in in_v1 else "not offered in cgroup.controllers"
            rows.append(Check(f"cgroup {c}", "warn", f"cgroup2 at {v2} has no {c} controller ({why}; used for: "
                              f"{_CGROUP_USE[c]})", "boot with cgroup2 only (systemd.unified_cgroup_hierarchy=1) "
                              f"or unmount the v1 {c} hierarchy; without it devices that share cores are not capped"))
    return rows


def check_python(version: tuple[int, ...] | None = None) -> Check:
    v = tuple(sys.version_info[:3]) if version is None else version
    ok = v[:2] >= MIN_PYTHON
    return Check("python", need(ok, True), f"{'.'.join(map(str, v))}",
                 "" if ok else "use Python ≥ 3.11", True)


def check_torch(find_spec: Callable[[str], Any] | None = None,
                version: Callable[[str], str] | None = None) -> Check:
    find_spec = find_spec or importlib.util.find_spec
    version = version or importlib.metadata.version
    if find_spec("torch") is None:
        return Check("torch", "warn", "not installed (only training/distributed jobs need it; "
                     "the control plane does not)", "pip install 'tidal[torch]' in the jobs' environment")
    try:
        v = version("torch")
    except importlib.metadata.PackageNotFoundError:
        v = "version unknown"
    return Check("torch", "ok", v)


def check_staging(base: Path | None = None, euid: int | None = None) -> Check:
    """Where checkpoint images are staged in memory: Tidal's large-page tmpfs (see
    ``tidal.mechanisms.criu.ramdisk``). Looked at only: nothing is mounted."""
    from tidal.mechanisms.criu import ramdisk
    from tidal.mechanisms.criu.rank import FAST_STAGING

    base = FAST_STAGING if base is None else base
    root = base / "tidal"
    euid = os.geteuid() if euid is None else euid
    if not base.is_dir():
        return Check("staging", "warn", f"{base} does not exist: images are staged on the node's disk",
                     "mount a tmpfs there, or set TIDAL_FAST_STAGING to one")
    opts = ramdisk.mount_options(root)
    if opts is not None:
        fs, options = opts.split(":", 1)
        if fs == "tmpfs" and "huge=within_size" in options.split(","):
            return Check("staging", "ok", f"{root}: tmpfs with large pages")
        return Check("staging", "warn", f"{root} is a {fs} mount without huge=within_size: dumps are slower",
                     f"unmount {root} when no job runs; Tidal then mounts its own")
    if not ramdisk.unused(root):
        return Check("staging", "warn", f"{root} holds files and is not Tidal's tmpfs: dumps are slower",
                     f"run `tidal down`, then remove what is left in {root}")
    if euid != 0:
        return Check("staging", "warn", f"{root} can be mounted only by root: images are staged in 4 KiB pages",
                     "run Tidal as root")
    return Check("staging", "ok", f"{root}: a tmpfs with large pages is mounted there at the first checkpoint")


# --------------------------------------------------------------------------- CRIU

# (feature to ask `criu check --feature` about, doctor row name, what Tidal uses it for)
CRIU_FEATURES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("mem_dirty_track",), "criu: mem_dirty_track", "iterative migration (pre-dump --track-mem)"),
    (("pidfd_store",), "criu: pidfd_store", "PID-reuse detection across pre-dumps"),
    (("uffd", "uffd-noncoop"), "criu: lazy pages", "lazy (post-copy) restore and migration"),
)


def locate_criu() -> tuple[Check, Criu | None]:
    """The CRIU row and the :class:`Criu` found (None when none works)."""
    from tidal.errors import TidalError
    from tidal.mechanisms.criu.provision import find_criu

    try:
        criu = find_criu()
    except TidalError as exc:
        return Check("criu", "missing", exc.message, exc.hint or MAKE_CRIU, True), None
    return Check("criu", "ok", f"{criu.version_str}, {criu.source}: {criu.argv[-1]}", required=True), criu


def check_criu_check(criu: Criu | None) -> Check:
    if criu is None:
        return Check("criu check", "missing", "no working CRIU to run", MAKE_CRIU, True)
    from tidal.mechanisms.criu.provision import check_passes

    ok, text = check_passes(criu.argv)
    last = text.splitlines()[-1] if text else "no output"
    return Check("criu check", need(ok, True), last,
                 "" if ok else "see `criu check` output; a kernel or CRIU upgrade may be needed", True)


def check_criu_feature(criu: Criu | None, features: tuple[str, ...], name: str, use: str) -> Check:
    if criu is None:
        return Check(name, "warn", f"unknown: no working CRIU ({use})", MAKE_CRIU)
    from tidal.mechanisms.criu.features import probe_feature

    probes = [probe_feature(criu.argv, f) for f in features]
    bad = [p for p in probes if not p.supported]
    if not bad:
        return Check(name, "ok", "supported" if len(features) == 1 else f"supported ({', '.join(features)})")
    said = "; ".join(p.message for p in bad)
    return Check(name, "warn", f"not available: {said}",
                 f"only for {use}; needs kernel support. Tidal works without it (stop-and-copy checkpoints)")


def check_other_accounts(criu: Criu | None, prefix: Path | None = None) -> Check:
    """Whether CRIU can dump a job of an ordinary account: tried on a real process of ``nobody``, since what
    breaks it (root without CAP_SYS_RESOURCE, LSM policy, ...) differs from machine to machine."""
    name = "criu: other accounts"
    if criu is None:
        return Check(name, "missing", "no working CRIU to try", MAKE_CRIU, True)
    if os.geteuid() != 0:
        return Check(name, "missing", "only root can checkpoint jobs of other accounts", "run Tidal as root", True)
    from tidal.errors import TidalError
    from tidal.mechanisms.criu import rlimits
    from tidal.mechanisms.criu.provision import default_prefix
    from tidal.mechanisms.criu.runner import CriuRunner

    prefix = prefix or default_prefix()
    proc = subprocess.Popen(["/bin/sleep", "60"], user=rlimits.UNPRIVILEGED, group=rlimits.UNPRIVILEGED,
                            extra_groups=[], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with tempfile.TemporaryDirectory(prefix="tidal-doctor-") as images:
            CriuRunner(criu).dump(proc.pid, Path(images), freezer=None, ghost_limit=1 << 20, prefix=prefix)
    except TidalError as exc:
        return Check(name, "missing", f"CRIU cannot dump a process of another account: {exc.message}",
                     exc.hint or MAKE_CRIU, True)
    finally:
        proc.kill()
        proc.wait()
    how = ("root reads their resource limits" if rlimits.reads_other_accounts()
           else f"root lacks CAP_SYS_RESOURCE: through {rlimits.shim_path(prefix)}")
    return Check(name, "ok", f"jobs of ordinary accounts can be checkpointed ({how})", required=True)


class _Once:
    """Calls ``fn`` once, for the first of the threads that ask; the others wait for its answer."""

    def __init__(self, fn: Callable[[], tuple[Check, Criu | None]]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._got: tuple[Check, Criu | None] | None = None

    def __call__(self) -> tuple[Check, Criu | None]:
        with self._lock:
            if self._got is None:
                self._got = self._fn()
            return self._got


def machine_checks() -> list[Planned]:
    """This machine's checks, in display order. The CRIU rows share one lookup of CRIU."""
    located = _Once(locate_criu)

    def criu() -> Criu | None:
        return located()[1]

    def feature(features: tuple[str, ...], name: str, use: str) -> Check:
        return check_criu_feature(criu(), features, name, use)

    return [
        Planned("kernel", True, check_kernel),
        Planned("root", True, check_root),
        Planned("criu", True, lambda: located()[0]),
        Planned("criu check", True, lambda: check_criu_check(criu())),
        Planned("criu: other accounts", True, lambda: check_other_accounts(criu())),
        *[Planned(name, False, partial(feature, f, name, use)) for f, name, use in CRIU_FEATURES],
        Planned("pid namespaces", True, check_pid_namespaces),
        Planned("cgroups", True, check_cgroups),
        Planned("python", True, check_python),
        Planned("torch", False, check_torch),
        Planned("staging", False, check_staging),
    ]
