"""Find or install a working CRIU (≥ 4.0).

Looked up in this order:

1. ``TIDAL_CRIU``: a path to a ``criu`` binary (or wrapper) given by the user;
2. a system ``criu`` ≥ 4.0 whose ``criu check`` passes;
3. a private prefix (``.criu/`` in the checkout, or ``TIDAL_CRIU_PREFIX``) holding Debian trixie's
   ``criu`` and the libraries it needs, unpacked with ``dpkg -x`` and run through its own loader, so the
   system is left untouched. Debian 12's CRIU 3.17 cannot dump on these kernels (``[vvar_vclock]``).

``python -m tidal.mechanisms.criu.provision`` installs (3) when neither (1) nor (2) works. It is
idempotent, keeps the downloaded ``.deb`` files, and works offline once installed. Only this set-up step
talks to a package registry.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tidal.errors import ProvisionError

MIN_VERSION = (4, 0)
SUITE = "trixie"
PACKAGES = [
    "criu", "libcompel1", "libc6", "libgnutls30t64", "libnftables1", "libnl-3-200",
    "libprotobuf-c1", "libbsd0", "libnet1", "libuuid1", "libmd0", "libnftnl11", "libmnl0",
    "libjansson4", "libxtables12", "libidn2-0", "libunistring5", "libtasn1-6", "libnettle8t64",
    "libhogweed6t64", "libgmp10", "libp11-kit0", "libffi8", "libedit2", "libtinfo6",
]
LIBDIR = "usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class Criu:
    """A usable CRIU: ``argv`` is the command prefix that runs it (a loader line for a private prefix)."""

    argv: tuple[str, ...]
    version: tuple[int, ...]
    source: str  # "TIDAL_CRIU", "system" or "prefix"

    @property
    def version_str(self) -> str:
        return ".".join(map(str, self.version))


def checkout_root() -> Path | None:
    """The source checkout this package runs from (editable install), if any."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "tidal").is_dir():
            return parent
    return None


def default_prefix() -> Path:
    env = os.environ.get("TIDAL_CRIU_PREFIX")
    if env:
        return Path(env)
    root = checkout_root()
    if root is not None:
        return root / ".criu"
    return Path.home() / ".cache" / "tidal" / "criu"


def prefix_argv(prefix: Path) -> tuple[str, ...]:
    lib = prefix / "root" / LIBDIR
    return (str(lib / "ld-linux-x86-64.so.2"), "--library-path", str(lib), str(prefix / "root/usr/sbin/criu"))


def _run(argv: tuple[str, ...] | list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def probe_version(argv: tuple[str, ...]) -> tuple[int, ...] | None:
    try:
        out = _run([*argv, "--version"], timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Version:\s*([0-9][0-9.]*)", out.stdout)
    if out.returncode != 0 or not m:
        return None
    return tuple(int(x) for x in m.group(1).strip(".").split("."))


def check_passes(argv: tuple[str, ...]) -> tuple[bool, str]:
    try:
        out = _run([*argv, "check"], timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    text = (out.stdout + out.stderr).strip()
    return out.returncode == 0 and "Looks good" in text, text


def _candidate(argv: tuple[str, ...], source: str) -> tuple[Criu | None, str]:
    version = probe_version(argv)
    if version is None:
        return None, f"{source}: `{' '.join(argv)} --version` did not run"
    if version < MIN_VERSION:
        return None, f"{source}: CRIU {'.'.join(map(str, version))} is older than 4.0"
    ok, text = check_passes(argv)
    if not ok:
        return None, f"{source}: `criu check` failed: {text.splitlines()[-1] if text else 'no output'}"
    return Criu(argv, version, source), ""


@lru_cache(maxsize=8)
def _find_cached(env_path: str | None, prefix: str) -> Criu:
    reasons: list[str] = []
    if env_path:
        found, why = _candidate((env_path,), "TIDAL_CRIU")
        if found:
            return found
        # An explicit choice that does not work is an error, not something to silently replace.
        raise ProvisionError(f"TIDAL_CRIU={env_path} is not a working CRIU ≥ 4.0: {why}",
                             hint="unset TIDAL_CRIU or point it at a working criu binary")
    system = shutil.which("criu")
    if system:
        found, why = _candidate((system,), "system")
        if found:
            return found
        reasons.append(why)
    pfx = Path(prefix)
    if (pfx / "root/usr/sbin/criu").exists():
        found, why = _candidate(prefix_argv(pfx), "prefix")
        if found:
            return found
        reasons.append(why)
    else:
        reasons.append(f"prefix: nothing installed in {pfx}")
    raise ProvisionError(
        "no working CRIU ≥ 4.0 found (" + "; ".join(reasons) + ")",
        hint="run `make criu` (or `python -m tidal.mechanisms.criu.provision`) to install one in "
        f"{pfx}, or set TIDAL_CRIU to a working criu binary",
    )


def find_criu(prefix: Path | None = None) -> Criu:
    """The CRIU to use, by the lookup order above; :class:`ProvisionError` when none works."""
    return _find_cached(os.environ.get("TIDAL_CRIU") or None, str(prefix or default_prefix()))


def _debian_uri() -> str:
    """The URI of the system's own Debian archive (so a mirror configured here is used)."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            m = re.match(r"URIs:\s*(\S+)", line)
            if m and "security" not in m.group(1):
                return m.group(1)
            m = re.match(r"deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", line)
            if m and "security" not in m.group(1):
                return m.group(1)
    return "http://deb.debian.org/debian"


def install_prefix(prefix: Path, log: bool = True) -> Criu:
    """Download (once) and unpack Debian trixie's CRIU into ``prefix``; idempotent."""
    def say(msg: str) -> None:
        if log:
            print(f"[criu] {msg}", file=sys.stderr, flush=True)

    debs = prefix / "debs"
    have = {p.name.split("_")[0] for p in debs.glob("*.deb")} if debs.is_dir() else set()
    missing = [p for p in PACKAGES if p not in have]
    if missing:
        if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
            raise ProvisionError("cannot install CRIU: apt-get/dpkg not found",
                                 hint="install criu ≥ 4.0 yourself and set TIDAL_CRIU")
        lists = prefix / "apt" / "lists"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        debs.mkdir(parents=True, exist_ok=True)
        sources = prefix / "apt" / "sources.list"
        sources.write_text(f"deb {_debian_uri()} {SUITE} main\n")
        opts = [f"-oDir::Etc::sourcelist={sources}", "-oDir::Etc::sourceparts=-",
                f"-oDir::State::Lists={lists}", "-oAPT::Get::List-Cleanup=0", "-qq"]
        say(f"downloading {len(missing)} packages from Debian {SUITE} into {debs}")
        out = _run(["apt-get", *opts, "update"], timeout=600)
        if out.returncode != 0:
            raise ProvisionError(f"apt-get update for Debian {SUITE} failed: {out.stderr.strip()[-500:]}",
                                 hint="check network access to the Debian archive, or set TIDAL_CRIU")
        out = subprocess.run(["apt-get", *opts, "download", *[f"{p}/{SUITE}" for p in missing]],
                             cwd=debs, capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            raise ProvisionError(f"downloading CRIU packages failed: {out.stderr.strip()[-500:]}",
                                 hint="check network access to the Debian archive, or set TIDAL_CRIU")
    root = prefix / "root"
    staging = prefix / "root.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    say(f"unpacking into {root}")
    for deb in sorted(debs.glob("*.deb")):
        out = _run(["dpkg", "-x", str(deb), str(staging)], timeout=300)
        if out.returncode != 0:
            raise ProvisionError(f"dpkg -x {deb.name} failed: {out.stderr.strip()}",
                                 hint=f"remove {debs} and run again to download fresh packages")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    _write_wrapper(prefix)
    _find_cached.cache_clear()
    found, why = _candidate(prefix_argv(prefix), "prefix")
    if not found:
        raise ProvisionError(f"CRIU unpacked in {prefix} does not work: {why}",
                             hint="run `tidal doctor` for details")
    (prefix / "installed.json").write_text(json.dumps({"version": found.version_str, "suite": SUITE}))
    return found


def _write_wrapper(prefix: Path) -> None:
    """A `bin/criu` script, so the private CRIU can be used like a normal binary (e.g. as TIDAL_CRIU)."""
    wrapper = prefix / "bin" / "criu"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(f'"{a}"' for a in prefix_argv(prefix)) + ' "$@"\n')
    wrapper.chmod(0o755)


def ensure_criu(prefix: Path | None = None, log: bool = True) -> Criu:
    """Return a working CRIU, installing the private prefix if nothing else works."""
    prefix = prefix or default_prefix()
    try:
        return find_criu(prefix)
    except ProvisionError:
        if os.environ.get("TIDAL_CRIU"):
            raise
    return install_prefix(prefix, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--prefix", type=Path, default=None, help="private prefix (default: .criu in the checkout)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    from tidal.mechanisms.criu import rlimits

    try:
        criu = ensure_criu(args.prefix, log=not args.quiet)
        shim = None if rlimits.reads_other_accounts() else rlimits.build(args.prefix or default_prefix())
    except ProvisionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"[criu] using CRIU {criu.version_str} ({criu.source}): {' '.join(criu.argv)}", file=sys.stderr)
        if shim is not None:
            print(f"[criu] root lacks CAP_SYS_RESOURCE here: dumps of other accounts' jobs preload {shim}",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
