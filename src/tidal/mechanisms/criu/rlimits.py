"""CRIU and jobs of other accounts: reading a task's resource limits without CAP_SYS_RESOURCE.

``criu dump`` reads every task's limits with prlimit(2). For a task of another account the kernel
allows that only with CAP_SYS_RESOURCE, which some container runtimes and VMs take away from root
(these machines among them): every job not run as root then fails to dump with "Can't get rlimit 0:
Operation not permitted". Where that is so, Tidal preloads a small library into CRIU (its C source ships
beside this file, built by ``make criu``) that answers such a read from ``/proc/PID/limits``, which root
reads without the capability. Nothing else changes: setting limits is never emulated.
"""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
from functools import lru_cache
from pathlib import Path

from tidal.errors import ProvisionError

SOURCE = Path(__file__).with_name("prlimit_shim.c")
NAME = "tidal-prlimit.so"
UNPRIVILEGED = 65534  # nobody: any account but root's will do


@lru_cache(maxsize=1)
def reads_other_accounts() -> bool:
    """Whether this process may read the resource limits of a task of another account."""
    if os.geteuid() != 0:
        return False
    proc = subprocess.Popen(["/bin/sleep", "30"], user=UNPRIVILEGED, group=UNPRIVILEGED, extra_groups=[],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        resource.prlimit(proc.pid, resource.RLIMIT_CPU)
        return True
    except PermissionError:
        return False
    finally:
        proc.kill()
        proc.wait()


def shim_path(prefix: Path) -> Path:
    return prefix / "lib" / NAME


def trusted(path: Path) -> bool:
    """Loaded into CRIU, which runs as root: it must be root's and writable by nobody else."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def build(prefix: Path) -> Path:
    """Compile the shim into ``prefix/lib`` (idempotent: rebuilt only when its source is newer)."""
    out = shim_path(prefix)
    if out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime and trusted(out):
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ProvisionError("no C compiler to build CRIU's prlimit shim, which jobs of other accounts need "
                             "on this machine (root lacks CAP_SYS_RESOURCE)",
                             hint="apt-get install gcc, then `make criu` again")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    done = subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ProvisionError(f"building {NAME} failed: {done.stderr.strip()[-400:]}", hint=f"{cc} {SOURCE}")
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


def dump_preload(prefix: Path) -> Path | None:
    """The library CRIU's dump needs preloaded here, if any (None: none needed, or none built)."""
    if reads_other_accounts():
        return None
    path = shim_path(prefix)
    return path if trusted(path) else None
