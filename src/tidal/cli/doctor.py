"""``tidal doctor``: is this machine ready to run Tidal, and what to do where it is not.

The checks are plain functions returning a :class:`Check`; :func:`run_checks` runs them (in threads,
so the whole thing stays well under a few seconds) and the command only renders them: a table, or
``--json``. The exit code is 1 when a *required* check is missing; warnings never fail.

Nothing here imports torch (the control plane must not need it): torch is looked up with
``importlib.util.find_spec`` and its version read from the package metadata.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import typer
from rich.table import Table

from tidal.cli.output import console

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


def _need(ok: bool, required: bool) -> Status:
    return "ok" if ok else ("missing" if required else "warn")


def _run(argv: Sequence[str], timeout: float = 10) -> tuple[int, str]:
    """Run a command; (exit code, stdout+stderr). Exit code -1 when it could not run or timed out."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return out.returncode, (out.stdout + out.stderr).strip()


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
    return Check("kernel", _need(ok, True), f"Linux {release}",
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
    rc, text = _run([unshare, "--pid", "--fork", "true"], timeout=10)
    if rc == 0:
        return Check("pid namespaces", "ok", "`unshare --pid --fork true` works", required=True)
    euid = os.geteuid() if euid is None else euid
    return Check("pid namespaces", "missing", f"`unshare --pid --fork true` failed: {text or rc}",
                 "run as root" if euid != 0 else "allow CLONE_NEWPID (container: run privileged)", True)


def cgroup_v1_controllers(mounts: str | None = None) -> dict[str, str]:
    """Mounted cgroup v1 controllers → mount point, from /proc/mounts."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            mounts = ""
    found: dict[str, str] = {}
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                found.setdefault(opt, parts[1])
    return found


_CGROUP_USE = {
    "freezer": "holds a rank still across a dump",
    "cpu": "CPU quota for CPU devices",
    "cpuset": "CPU sets for CPU devices",
}


def check_cgroup(controller: str, required: bool, mounts: str | None = None) -> Check:
    name = f"cgroup {controller}"
    where = cgroup_v1_controllers(mounts).get(controller)
    use = _CGROUP_USE.get(controller, "")
    if where:
        return Check(name, "ok", f"v1 at {where}", required=required)
    return Check(name, _need(False, required), f"cgroup v1 {controller} not mounted (used for: {use})",
                 f"mount it: mkdir -p /sys/fs/cgroup/{controller} && "
                 f"mount -t cgroup -o {controller} cgroup /sys/fs/cgroup/{controller}", required)


def check_python(version: tuple[int, ...] | None = None) -> Check:
    v = tuple(sys.version_info[:3]) if version is None else version
    ok = v[:2] >= MIN_PYTHON
    return Check("python", _need(ok, True), f"{'.'.join(map(str, v))}",
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


def find_postgres(which: Callable[[str], str | None] = shutil.which,
                  pattern: str = "/usr/lib/postgresql/*/bin") -> str | None:
    """Directory holding ``postgres`` and ``initdb``: on PATH or under /usr/lib/postgresql/*/bin."""
    pg, initdb = which("postgres"), which("initdb")
    if pg and initdb:
        return str(Path(pg).parent)
    for d in sorted(glob.glob(pattern), reverse=True):
        if Path(d, "postgres").exists() and Path(d, "initdb").exists():
            return d
    return None


def check_postgres(db_url: str | None = None, found: str | Literal[False] | None = False) -> Check:
    db_url = os.environ.get("TIDAL_DATABASE_URL", "") if db_url is None else db_url
    needed = db_url.startswith("postgres")
    where = find_postgres() if found is False else found
    why = ("TIDAL_DATABASE_URL is postgresql" if needed
           else "only for TIDAL_DATABASE_URL=postgresql://...; default SQLite")
    if where:
        return Check("postgresql server", "ok", f"in {where}", required=needed)
    fix = ("install PostgreSQL (e.g. apt-get install postgresql) or put its bin directory on PATH" if needed
           else "nothing to do unless you want PostgreSQL: apt-get install postgresql")
    return Check("postgresql server", _need(False, needed), f"postgres/initdb not found ({why})", fix, needed)


def check_gpus(which: Callable[[str], str | None] = shutil.which,
               run: Callable[[Sequence[str]], tuple[int, str]] = _run) -> list[Check]:
    smi = which("nvidia-smi")
    if smi is None:
        return [Check("gpus", "ok", "none (CPU devices only)"),
                Check("cuda-checkpoint", "ok", "not needed (no GPUs)")]
    rc, text = run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if rc != 0:
        gpus = Check("gpus", "warn", f"nvidia-smi failed: {text.splitlines()[-1] if text else rc}",
                     "check the NVIDIA driver (nvidia-smi must run)")
    else:
        rows = [r.split(",") for r in text.splitlines() if r.strip()]
        drivers = sorted({r[1].strip() for r in rows if len(r) > 1})
        names = sorted({r[0].strip() for r in rows})
        gpus = Check("gpus", "ok", f"{len(rows)} GPU(s): {', '.join(names)}; driver {', '.join(drivers)}")
    cc = which("cuda-checkpoint")
    if cc:
        ckpt = Check("cuda-checkpoint", "ok", cc)
    else:
        ckpt = Check("cuda-checkpoint", "warn", "not found: GPU jobs cannot be checkpointed with CRIU",
                     "install NVIDIA's cuda-checkpoint (driver ≥ 550) and put it on PATH")
    return [gpus, ckpt]


def check_home(home: Path | None = None) -> Check:
    source = "TIDAL_HOME" if os.environ.get("TIDAL_HOME") else "default"
    if home is None:
        from tidal.config import load_settings

        home = load_settings().home
    existing = home
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    writable = os.access(existing, os.W_OK | os.X_OK) and existing.is_dir()
    state = "writable" if existing == home else f"to be created in {existing}"
    if writable:
        return Check("TIDAL_HOME", "ok", f"{home} ({source}; {state})", required=True)
    return Check("TIDAL_HOME", "missing", f"{home} ({source}) is not writable",
                 "set TIDAL_HOME to a writable directory", True)


# --------------------------------------------------------------------------- CRIU

# (feature to ask `criu check --feature` about, doctor row name, what Tidal uses it for)
CRIU_FEATURES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("mem_dirty_track",), "criu: mem_dirty_track", "iterative migration (pre-dump --track-mem)"),
    (("pidfd_store",), "criu: pidfd_store", "PID-reuse detection across pre-dumps"),
    (("uffd", "uffd-noncoop"), "criu: lazy pages", "lazy (post-copy) restore and migration"),
)


def locate_criu() -> tuple[Check, Any]:
    """The CRIU row and the :class:`Criu` found (None when none works)."""
    from tidal.errors import TidalError
    from tidal.mechanisms.criu.provision import find_criu

    try:
        criu = find_criu()
    except TidalError as exc:
        return Check("criu", "missing", exc.message, exc.hint or MAKE_CRIU, True), None
    return Check("criu", "ok", f"{criu.version_str}, {criu.source}: {criu.argv[-1]}", required=True), criu


def check_criu_check(criu: Any) -> Check:
    if criu is None:
        return Check("criu check", "missing", "no working CRIU to run", MAKE_CRIU, True)
    from tidal.mechanisms.criu.provision import check_passes

    ok, text = check_passes(criu.argv)
    last = text.splitlines()[-1] if text else "no output"
    return Check("criu check", _need(ok, True), last,
                 "" if ok else "see `criu check` output; a kernel or CRIU upgrade may be needed", True)


def check_criu_feature(criu: Any, features: tuple[str, ...], name: str, use: str) -> Check:
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


def check_other_accounts(criu: Any, prefix: Path | None = None) -> Check:
    """Whether CRIU can dump a job of an ordinary account: tried on a real process of ``nobody``, since what
    breaks it (root without CAP_SYS_RESOURCE, LSM policy, ...) differs from machine to machine."""
    name = "criu: other accounts"
    if criu is None:
        return Check(name, "missing", "no working CRIU to try", MAKE_CRIU, True)
    if os.geteuid() != 0:
        return Check(name, "missing", "only root can checkpoint jobs of other accounts", "run Tidal as root", True)
    import tempfile

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


# --------------------------------------------------------------------------- running and rendering


def _safe(name: str, required: bool, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    try:
        got = fn()
    except Exception as exc:  # a broken check is a finding, not a crash of doctor
        return [Check(name, "missing" if required else "warn", f"check failed: {type(exc).__name__}: {exc}",
                      "report this as a bug in `tidal doctor`", required)]
    return got if isinstance(got, list) else [got]


def check_staging(base: Path | None = None, euid: int | None = None) -> Check:
    """Where checkpoint images are staged in memory: Tidal's large-page tmpfs (see
    ``tidal.mechanisms.criu.ramdisk``). Looked at only: doctor mounts nothing."""
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


def run_checks() -> list[Check]:
    """All checks, in display order; run concurrently (subprocesses dominate)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        criu_f: Future[tuple[Check, Any]] = pool.submit(locate_criu)  # first: others wait on it

        def criu() -> Any:
            return criu_f.result()[1]

        jobs: list[tuple[str, bool, Callable[[], Check | list[Check]]]] = [
            ("kernel", True, check_kernel),
            ("root", True, check_root),
            ("criu", True, lambda: criu_f.result()[0]),
            ("criu check", True, lambda: check_criu_check(criu())),
            ("criu: other accounts", True, lambda: check_other_accounts(criu())),
            *[(name, False, (lambda f=f, n=name, u=use: check_criu_feature(criu(), f, n, u)))
              for f, name, use in CRIU_FEATURES],
            ("pid namespaces", True, check_pid_namespaces),
            ("cgroup freezer", True, lambda: check_cgroup("freezer", True)),
            ("cgroup cpu", False, lambda: check_cgroup("cpu", False)),
            ("cgroup cpuset", False, lambda: check_cgroup("cpuset", False)),
            ("python", True, check_python),
            ("torch", False, check_torch),
            ("postgresql server", False, check_postgres),
            ("gpus", False, check_gpus),
            ("TIDAL_HOME", True, check_home),
            ("staging", False, check_staging),
        ]
        futures = [pool.submit(_safe, name, req, fn) for name, req, fn in jobs]
        return [c for f in futures for c in f.result()]


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.failed for c in checks) else 0


def to_json(checks: Sequence[Check]) -> dict[str, Any]:
    return {"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]}


_STYLE = {"ok": "[green]OK[/]", "warn": "[yellow]warn[/]", "missing": "[bold red]MISSING[/]"}


def render(checks: Sequence[Check]) -> None:
    table = Table(title="tidal doctor", title_justify="left", expand=True)
    table.add_column("requirement", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=3)
    table.add_column("how to fix", overflow="fold", ratio=2)
    for c in checks:
        label = c.name if c.required else f"{c.name} [dim]opt.[/]"
        table.add_row(label, _STYLE[c.status], c.detail, c.fix)
    console.print(table, highlight=False)
    failed = [c.name for c in checks if c.failed]
    warns = sum(c.status == "warn" for c in checks)
    if failed:
        console.print(f"[bold red]{len(failed)} required check(s) missing:[/] {', '.join(failed)}",
                      highlight=False)
    else:
        console.print(f"[green]Ready:[/] every required check passes; {warns} optional item(s) missing.",
                      highlight=False)


def doctor(
    as_json: bool = typer.Option(False, "--json", help="print the checks as JSON"),
) -> None:
    """Check this machine: kernel, root, CRIU and its features, cgroups, torch, PostgreSQL, GPUs."""
    checks = run_checks()
    if as_json:
        typer.echo(json.dumps(to_json(checks), indent=2))
    else:
        render(checks)
    raise typer.Exit(exit_code(checks))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    if app.registered_callback is None:
        # Without a callback, a Typer app with a single command runs it as the root command, and
        # `tidal doctor` would be rejected; a no-op callback keeps `tidal` a group of sub-commands.
        app.callback()(_group)


def _group() -> None:
    pass
