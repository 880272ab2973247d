"""What a rank holds that CRIU cannot checkpoint, named before anything is frozen: an established TCP
connection (to a service outside the job, or any the script opened itself), any other internet or packet
socket where the kernel makes CRIU fail on it, and an ``io_uring`` instance. Read from /proc (a socket the
kernel lists in no table of /proc/PID/net is looked at through a copy of its descriptor). The interposer's
own connections are gone by then (the cut tore its groups down).

Since Linux 6.16, ``getsockopt(SO_PASSCRED)`` (and ``SO_PASSSEC``) fails with EOPNOTSUPP on every socket
that is not AF_UNIX, AF_NETLINK or Bluetooth, and CRIU (4.1.1 and earlier) reads both from every socket it
dumps: such a kernel makes ``criu dump`` fail on any internet socket, listening, closed or UDP alike
(``sockets: Can't get 1:16 opt: Operation not supported``). Where that holds (:func:`inet_dumpable`), each one
is named here instead, so that the job goes on and its owner learns which socket it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import socket
from functools import lru_cache
from pathlib import Path

_ESTABLISHED = "01"
_TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
    "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}
# The tables of /proc/PID/net that list internet sockets, and the kind of socket each lists.
_INET_TABLES = {"tcp": "tcp", "tcp6": "tcp", "udp": "udp", "udp6": "udp", "udplite": "udp", "udplite6": "udp",
                "raw": "raw", "raw6": "raw"}
# Sockets CRIU dumps on any kernel.
_OTHER_TABLES = ("unix", "netlink")
WHAT_TO_DO = {
    "tcp": "close the connection before a checkpoint can come (or reconnect on error), or submit the job without "
           "checkpoints; the job goes on",
    "socket": "close the socket before a checkpoint can come (or open it anew after one), or submit the job "
              "without checkpoints: CRIU cannot checkpoint an internet or packet socket on this kernel (Linux "
              "≥ 6.16 refuses SO_PASSCRED on it, which CRIU reads); the job goes on",
    "io_uring": "use ordinary file I/O (CRIU cannot checkpoint io_uring); the job goes on",
}
_SYS_PIDFD_GETFD = 438  # the same number on every architecture (asm-generic table, Linux ≥ 5.6)


@lru_cache(maxsize=1)
def inet_dumpable() -> bool:
    """Whether CRIU can dump an internet socket that is not an established connection on this kernel: it reads
    SO_PASSCRED of every socket, which Linux ≥ 6.16 refuses for any but AF_UNIX, AF_NETLINK and Bluetooth."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.getsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED)
        except OSError as exc:
            return exc.errno != errno.EOPNOTSUPP
    return True


def _addr(hexaddr: str) -> str:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        host = str(ipaddress.IPv4Address(raw[::-1]))
    else:  # four little-endian 32-bit words
        host = str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
        host = f"[{host}]"
    return f"{host}:{int(port, 16)}"


def _tables(pid: int) -> tuple[dict[str, tuple[str, str, str, str]], set[str]]:
    """The sockets of ``pid``'s network namespace the kernel lists: inode → (kind, TCP state, local, remote)
    for internet sockets, and the inodes of unix and netlink sockets."""
    inet: dict[str, tuple[str, str, str, str]] = {}
    for name, kind in _INET_TABLES.items():
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9:
                inet[f[9]] = (kind, f[3], _addr(f[1]), _addr(f[2]))
    other: set[str] = set()
    for name in _OTHER_TABLES:
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        column = 6 if name == "unix" else 9  # unix: Num RefCount Protocol Flags Type St Inode Path
        for line in lines:
            f = line.split()
            if len(f) > column:
                other.add(f[column])
    return inet, other


def _probe(pid: int, fd: int) -> tuple[int, int, str] | None:
    """(family, type, local address) of socket ``fd`` of ``pid``, from a copy of the descriptor; None where it
    cannot be had (no pidfd_getfd before Linux 5.6, the process gone, not allowed)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        copy = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            return None
    finally:
        os.close(pidfd)
    try:
        with socket.socket(fileno=copy) as s:
            try:
                family, kind = int(s.family), int(s.type)
                local = ""
                if family in (socket.AF_INET, socket.AF_INET6):
                    name = s.getsockname()
                    if name[1]:
                        local = f"{name[0]}:{name[1]}" if family == socket.AF_INET else f"[{name[0]}]:{name[1]}"
                return family, kind, local
            finally:
                s.detach()  # closed below: the socket object must not close it a second time
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(copy)


def _socket(pid: int, fd: str, inode: str, inet: dict[str, tuple[str, str, str, str]],
            other: set[str]) -> tuple[str, str] | None:
    """(what, what to do) for a socket CRIU cannot dump, or None."""
    listed = inet.get(inode)
    if listed is not None:
        kind, state, local, remote = listed
        if kind == "tcp" and state == _ESTABLISHED:
            return f"a TCP connection {local} -> {remote} (fd {fd})", WHAT_TO_DO["tcp"]
        if inet_dumpable():
            return None
        if kind == "tcp":
            if state == "0A":
                return f"a listening TCP socket on {local} (fd {fd})", WHAT_TO_DO["socket"]
            return (f"a TCP socket {local} -> {remote} in state {_TCP_STATES.get(state, state)} (fd {fd})",
                    WHAT_TO_DO["socket"])
        return f"a{' UDP' if kind == 'udp' else ' raw IP'} socket on {local} (fd {fd})", WHAT_TO_DO["socket"]
    if inode in other or inet_dumpable():
        return None
    # Listed nowhere: a TCP socket never connected or closed by its peer (TCP lists neither), an unbound UDP
    # socket, a packet socket; or a unix or netlink one that is not bound yet. Its descriptor tells.
    probed = _probe(pid, int(fd))
    if probed is None:
        return None
    family, stype, local = probed
    if family in (socket.AF_INET, socket.AF_INET6):
        name = {int(socket.SOCK_STREAM): "TCP", int(socket.SOCK_DGRAM): "UDP"}.get(stype, "raw IP")
        where = f" on {local}" if local else ""
        state = " that is not connected (or was closed by its peer)" if stype == socket.SOCK_STREAM else ""
        return f"a {name} socket{where}{state} (fd {fd})", WHAT_TO_DO["socket"]
    if family == socket.AF_PACKET:
        return f"a packet socket (fd {fd})", WHAT_TO_DO["socket"]
    return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def unsupported(pids: list[int]) -> list[tuple[int, str, str, str]]:
    """(pid, its command name, the resource, what to do) for each resource of ``pids`` CRIU cannot dump."""
    found = []
    by_netns: dict[str, tuple[dict[str, tuple[str, str, str, str]], set[str]]] = {}  # read once per namespace
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in sorted(fds, key=int):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                try:
                    netns = os.readlink(f"/proc/{pid}/ns/net")
                except OSError:
                    netns = f"pid {pid}"
                if netns not in by_netns:
                    by_netns[netns] = _tables(pid)
                blocked = _socket(pid, fd, target[8:-1], *by_netns[netns])
                if blocked is not None:
                    found.append((pid, _comm(pid), *blocked))
            elif target == "anon_inode:[io_uring]":
                found.append((pid, _comm(pid), f"an io_uring instance (fd {fd})", WHAT_TO_DO["io_uring"]))
    return found


def describe(found: list[tuple[int, str, str, str]]) -> str:
    return "; ".join(f"process {pid} ({comm}) holds {what}" for pid, comm, what, _ in found)
