"""Runs CRIU: dump, pre-dump, restore and feature checks, with errors that quote CRIU's own reason."""

from __future__ import annotations

import os
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from tidal.errors import CheckpointError, Unsupported
from tidal.mechanisms.criu import rlimits
from tidal.mechanisms.criu.provision import Criu, default_prefix, find_criu
from tidal.mechanisms.machinelock import machine_lock

HARMLESS = ("Can't setup RLIMIT_NOFILE",)
LAZY_SOCKET = "lazy-pages.socket"  # where ``criu lazy-pages`` listens, in its images directory
# A task caught in the middle of exiting cannot be seized until it has exited (CRIU says so itself):
# these dump failures are worth one more try after letting the rank run for a moment.
TRANSIENT = ("Unseizable non-zombie", "zombie found while seizing", "Timeout reached")


# CRIU's parasite mounts a private procfs for a task in another PID namespace at a fixed path of the
# task's mount namespace: two dumps at once on one machine (two node roots of one job) collide there
# ("Can't create a directory (-17)"). Dumps on a machine take turns.
DUMP_LOCK = Path(os.environ.get("TIDAL_LOCK_DIR", "/run/lock" if os.path.isdir("/run/lock") else "/tmp")) / (
    "tidal-criu-dump.lock")


class TransientDumpError(CheckpointError):
    """CRIU could not seize every task this time; a retry is likely to work."""


def _log_errors(log: Path, limit: int = 6) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no CRIU log"
    errs = [ln for ln in lines if "Error" in ln and not any(h in ln for h in HARMLESS)]
    return " | ".join(errs[-limit:]) or (lines[-1] if lines else "empty CRIU log")


class CriuRunner:
    def __init__(self, criu: Criu | None = None) -> None:
        self.criu = criu or find_criu()
        self.log_level = 2  # CRIU's -v: errors and warnings; 4 logs every step

    def _run(self, args: list[str], log: Path, pass_fds: tuple[int, ...] = (), what: str = "criu",
             timeout: float = 600, preload: Path | None = None) -> None:
        argv = [*self.criu.argv, *args, f"-v{self.log_level}", "-o", log.name]
        env = {**os.environ, "LD_PRELOAD": str(preload)} if preload else None
        try:
            out = subprocess.run(argv, capture_output=True, text=True, pass_fds=pass_fds, timeout=timeout,
                                 check=False, env=env)
        except subprocess.TimeoutExpired as exc:
            raise CheckpointError(f"{what} timed out after {timeout:.0f}s", object=str(log.parent),
                                  hint=f"full CRIU log: {log}") from exc
        if out.returncode != 0:
            errors = _log_errors(log)
            cls = TransientDumpError if any(t in errors for t in TRANSIENT) else CheckpointError
            hint = f"full CRIU log: {log}"
            if "Can't get rlimit" in errors:
                hint = ("root may not read the limits of another account's task here (no CAP_SYS_RESOURCE): "
                        "run `make criu` (it builds Tidal's prlimit shim) and see `tidal doctor`; " + hint)
            raise cls(f"{what} failed: {errors}", object=str(log.parent), hint=hint)

    def dump(self, pid: int, images: Path, *, freezer: Path | None, ghost_limit: int,
             prefix: Path | None = None) -> None:
        """Dump the tree of ``pid``; it keeps running (or stays frozen, with ``freezer``: the rank's cgroup, a v1
        freezer group or a cgroup2 group, which CRIU ≥ 4.0 tells apart itself and leaves as frozen as it found
        it). ``prefix``: where ``make criu`` put what CRIU needs besides itself (default: the checkout's
        ``.criu``). Cgroups are Tidal's business (``--manage-cgroups=ignore``): see :meth:`restore`."""
        args = ["dump", "-t", str(pid), "-D", str(images), "--manage-cgroups=ignore", "--timeout=5",
                f"--ghost-limit={ghost_limit}", "--file-locks", "--link-remap"]
        if freezer is not None:
            args += ["--freeze-cgroup", str(freezer)]
        args.append("--leave-running")
        with machine_lock(DUMP_LOCK):
            self._run(args, images / "dump.log", what=f"criu dump of pid {pid}",
                      preload=rlimits.dump_preload(prefix or default_prefix()))

    def pre_dump(self, pid: int, images: Path, *, freezer: Path | None = None) -> None:
        """Iterative pre-copy: only where the kernel tracks dirty memory."""
        if not self.supports("mem_dirty_track"):
            raise Unsupported("pre-dump needs memory dirty-tracking, which this kernel does not offer "
                              "(`criu check --feature mem_dirty_track` fails)",
                              hint="take full checkpoints; the store still keeps unchanged pages once")
        args = ["pre-dump", "-t", str(pid), "-D", str(images), "--track-mem", "--manage-cgroups=ignore"]
        if freezer is not None:
            args += ["--freeze-cgroup", str(freezer)]
        with machine_lock(DUMP_LOCK):
            self._run(args, images / "pre-dump.log", what=f"criu pre-dump of pid {pid}")

    def restore(self, images: Path, *, pidfile: Path, inherit: dict[int, str],
                lazy: bool = False) -> subprocess.Popen[bytes] | None:
        """Restore the tree dumped in ``images``, left stopped. ``lazy``: its anonymous memory is filled in
        after it resumes, by a ``criu lazy-pages`` daemon that serves page faults from the images and pushes
        the rest in the background (userfaultfd): returned, it exits once every page is in. The images
        must stay until then. ``--manage-cgroups=ignore``: the tree comes back in CRIU's own cgroups, left
        stopped, and the owner moves it into the rank's group before it runs, on either cgroup version (the
        dumping host's groups are not looked at: a v1 host's checkpoint restores on a cgroup2 host)."""
        args = ["restore", "-D", str(images), "--restore-detached", "--leave-stopped",
                "--pidfile", str(pidfile), "--manage-cgroups=ignore", "--file-locks"]
        for fd, key in inherit.items():
            args += ["--inherit-fd", f"fd[{fd}]:{key}"]
        pager = self._start_pager(images) if lazy else None
        if pager is not None:
            args.append("--lazy-pages")
        try:
            self._run(args, images / "restore.log", pass_fds=tuple(inherit), what="criu restore")
        except BaseException:
            if pager is not None:
                pager.kill()
                pager.wait()
            raise
        return pager

    def _start_pager(self, images: Path, timeout: float = 10.0) -> subprocess.Popen[bytes]:
        log = images / "lazy-pages.log"
        pager = subprocess.Popen([*self.criu.argv, "lazy-pages", "-D", str(images), "-v2", "-o", log.name],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (images / LAZY_SOCKET).exists():  # restore connects to it at once
            if pager.poll() is not None or time.monotonic() > deadline:
                pager.kill()
                pager.wait()
                raise CheckpointError(f"criu lazy-pages did not start: {_log_errors(log)}", object=str(images),
                                      hint=f"full CRIU log: {log}")
            time.sleep(0.002)
        return pager

    def supports(self, feature: str) -> bool:
        return _feature(self.criu.argv, feature)


@lru_cache(maxsize=32)
def _feature(argv: tuple[str, ...], feature: str) -> bool:
    out = subprocess.run([*argv, "check", "--feature", feature], capture_output=True, text=True,
                         timeout=60, check=False)
    text = out.stdout + out.stderr
    return out.returncode == 0 and "is supported" in text and "OFF" not in text
