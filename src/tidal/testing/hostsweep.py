"""What a :class:`tidal.testing.hosts.TestNet` leaves on the machine, found by name, and its removal.

Every run of test hosts has a tag: its owner's pid in base 36 (5 characters) and 3 random ones, so that
runs at the same time never share a name and a leftover names the process that made it. The tag is in
every name the run gives:

- its directory ``/tmp/tidal-net-TAG`` (made first, removed last: the run's record, ``run.json``, holds the
  owner's pid and start time, so a reused pid is not taken for the owner);
- its bridge ``tdbTAG`` and the hosts' switch ports ``tdvTAGnn`` (Linux allows 15 characters);
- its network namespaces ``PREFIX-TAG-HOST``.

:func:`sweep` removes what runs whose owner is dead left behind (a test process killed with SIGKILL leaves
everything): the test-net fixture calls it before it builds a net. A run's watchdog
(``python -m tidal.testing.hostsweep --watch PID --tag TAG``, started by the run unless told otherwise)
does the same as soon as its owner dies.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import secrets
import select
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tidal.errors import TidalError
from tidal.testing.netns import NETNS_DIR, ip, kill_netns, netns_pids
from tidal.testing.processes import pid_alive

RUN_ROOT = Path("/tmp")
RUN_DIR_PREFIX = "tidal-net-"
BRIDGE_PREFIX = "tdb"
PORT_PREFIX = "tdv"
#: Held while bridges, addresses and the guard route are added or removed, by every run on the machine.
LOCK_PATH = Path("/run/tidal-testnet.lock")
#: The benchmarking range (RFC 2544). Test nets take /24s of it; while any exists, the root namespace has
#: an "unreachable" route for the whole range, so that nothing addressed to a test host that is gone ever
#: follows the default route off the machine.
GUARD_ROUTE = "198.18.0.0/15"

_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_TAG = r"[0-9a-z]{8}"
_NAME = r"[a-z][a-z0-9]{0,11}"


def _base36(n: int, width: int) -> str:
    digits = ""
    while n:
        n, d = divmod(n, 36)
        digits = _B36[d] + digits
    return digits.rjust(width, "0")


def new_tag(pid: int | None = None) -> str:
    return _base36(os.getpid() if pid is None else pid, 5) + "".join(secrets.choice(_B36) for _ in range(3))


def tag_owner(tag: str) -> int:
    return int(tag[:5], 36)


def run_dir(tag: str) -> Path:
    return RUN_ROOT / f"{RUN_DIR_PREFIX}{tag}"


def bridge_name(tag: str) -> str:
    return f"{BRIDGE_PREFIX}{tag}"


def port_name(tag: str, index: int) -> str:
    return f"{PORT_PREFIX}{tag}{_base36(index, 2)}"


def netns_name(prefix: str, tag: str, host: str) -> str:
    return f"{prefix}-{tag}-{host}"


def valid_name(name: str) -> bool:
    """Whether ``name`` may be a name prefix or a host name: a lower-case letter, then up to 11 lower-case
    letters or digits."""
    return re.fullmatch(_NAME, name) is not None


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Exclusive among the runs on this machine: for bridges, subnets and the guard route."""
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``None`` if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(") ", 1)[1].split()[19])


def write_record(tag: str, prefix: str) -> Path:
    """Make the run's directory (mode 0755) and its record; the directory."""
    d = run_dir(tag)
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    owner = os.getpid()
    (d / "run.json").write_text(json.dumps({"owner": owner, "start": start_time(owner), "prefix": prefix}))
    return d


def owner_alive(tag: str) -> bool:
    pid = tag_owner(tag)
    if not pid_alive(pid):
        return False
    try:
        recorded = json.loads((run_dir(tag) / "run.json").read_text()).get("start")
    except (OSError, ValueError):
        return True  # no record (yet): the pid is all there is to go by
    return recorded is None or recorded == start_time(pid)


def _links() -> list[str]:
    try:
        return os.listdir("/sys/class/net")
    except OSError:
        return []


@dataclass
class Leftovers:
    """What a run's tag still names on the machine."""

    tag: str
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    dir: Path | None = None
    pids: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.dir or self.pids)


def find(tag: str | None = None) -> dict[str, Leftovers]:
    """Everything named by a run's tag (``tag``, or every run's), by tag."""
    found: dict[str, Leftovers] = {}

    def of(t: str) -> Leftovers:
        return found.setdefault(t, Leftovers(t))

    for entry in os.listdir(RUN_ROOT):
        m = re.fullmatch(RUN_DIR_PREFIX + f"({_TAG})", entry)
        if m and (tag is None or m.group(1) == tag):
            of(m.group(1)).dir = RUN_ROOT / entry
    for name in _links():
        m = re.fullmatch(f"(?:{BRIDGE_PREFIX}({_TAG})|{PORT_PREFIX}({_TAG})[0-9a-z]{{2}})", name)
        t = m and (m.group(1) or m.group(2))
        if t and (tag is None or t == tag):
            of(t).links.append(name)
    # A namespace is ours only if its tag is: the run's directory (made first, removed last) or its links.
    namespaces = sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else []
    for t, left in found.items():
        left.namespaces = [n for n in namespaces if re.fullmatch(f"{_NAME}-{t}-{_NAME}", n)]
        left.pids = sorted(p for n in left.namespaces for p in netns_pids(n))
    return found


def ensure_guard_route() -> None:
    """Add the guard route (call with :func:`machine_lock` held)."""
    ip("route", "replace", "unreachable", GUARD_ROUTE)


def drop_guard_route_if_unused() -> None:
    """Remove the guard route if no test net's bridge is left (call with :func:`machine_lock` held)."""
    if not any(re.fullmatch(f"{BRIDGE_PREFIX}{_TAG}", n) for n in _links()):
        ip("route", "del", "unreachable", GUARD_ROUTE, check=False)


def destroy(tag: str, grace: float = 3.0) -> None:
    """Remove everything run ``tag`` made: end the processes in its namespaces (SIGTERM, SIGKILL after
    ``grace`` seconds), delete the namespaces, its links and bridge, then its directory."""
    left = find(tag).get(tag)
    if left is None:
        return
    problems: list[str] = []
    for ns in left.namespaces:
        try:
            kill_netns(ns, grace)
        except TidalError as e:
            problems.append(str(e))
    with machine_lock():
        for ns in left.namespaces:
            p = ip("netns", "del", ns, check=False)
            if p.returncode != 0 and (NETNS_DIR / ns).exists():
                problems.append(f"ip netns del {ns}: {p.stderr.strip()}")
        # A port's pair is deleted with it; a host's end may already have gone with its namespace.
        for link in sorted(left.links, reverse=True):  # ports (tdv...) before the bridge (tdb...)
            p = ip("link", "del", link, check=False)
            if p.returncode != 0 and Path("/sys/class/net", link).exists():
                problems.append(f"ip link del {link}: {p.stderr.strip()}")
        drop_guard_route_if_unused()
    if left.dir is not None:
        shutil.rmtree(left.dir, ignore_errors=True)
        if left.dir.exists():
            problems.append(f"{left.dir} could not be removed")
    if problems:
        raise TidalError(f"test net {tag} was not removed entirely: " + "; ".join(problems),
                         hint="python -m tidal.testing.hostsweep removes what is left once its owner is gone")


def sweep(grace: float = 1.0) -> list[str]:
    """Remove the leftovers of every run whose owner is dead; the tags removed."""
    removed = []
    for tag in find():
        if not owner_alive(tag):
            destroy(tag, grace)
            removed.append(tag)
    return removed


def watch(owner: int, tag: str) -> None:
    """Wait for process ``owner`` to end, then remove run ``tag``'s leftovers."""
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable once the owner has ended
        os.close(fd)
    destroy(tag, grace=1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tidal.testing.hostsweep",
                                     description="Remove what test nets whose owner is dead left behind.")
    parser.add_argument("--watch", type=int, metavar="PID", help="wait for PID to end, then remove --tag's run")
    parser.add_argument("--tag", help="the run to remove after --watch's process ends")
    args = parser.parse_args(argv)
    if args.watch is not None:
        if not args.tag:
            parser.error("--watch needs --tag")
        watch(args.watch, args.tag)
    else:
        for tag in sweep():
            print(f"removed test net {tag}")


if __name__ == "__main__":
    main()
