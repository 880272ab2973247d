"""What a rank holds that CRIU cannot checkpoint, named before anything is frozen: an established TCP
connection (to a service outside the job, or any the script opened itself) and an ``io_uring`` instance.
Read from /proc only. The interposer's own connections are gone by then (the cut tore its groups down)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

_ESTABLISHED = "01"
WHAT_TO_DO = {
    "tcp": "close the connection before a checkpoint can come (or reconnect on error), or submit the job without "
           "checkpoints; the job goes on",
    "io_uring": "use ordinary file I/O (CRIU cannot checkpoint io_uring); the job goes on",
}


def _addr(hexaddr: str) -> str:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        host = str(ipaddress.IPv4Address(raw[::-1]))
    else:  # four little-endian 32-bit words
        host = str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
        host = f"[{host}]"
    return f"{host}:{int(port, 16)}"


def _tcp_connections(pid: int) -> dict[str, str]:
    """socket inode → "local -> remote" for the established TCP connections of ``pid``'s network namespace."""
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _ESTABLISHED:
                out[f[9]] = f"{_addr(f[1])} -> {_addr(f[2])}"
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def unsupported(pids: list[int]) -> list[tuple[int, str, str, str]]:
    """(pid, its command name, the resource, what to do) for each resource of ``pids`` CRIU cannot dump."""
    found = []
    for pid in pids:
        tcp: dict[str, str] | None = None
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                if tcp is None:
                    tcp = _tcp_connections(pid)
                conn = tcp.get(target[8:-1])
                if conn is not None:
                    found.append((pid, _comm(pid), f"a TCP connection {conn} (fd {fd})", WHAT_TO_DO["tcp"]))
            elif target == "anon_inode:[io_uring]":
                found.append((pid, _comm(pid), f"an io_uring instance (fd {fd})", WHAT_TO_DO["io_uring"]))
    return found


def describe(found: list[tuple[int, str, str, str]]) -> str:
    return "; ".join(f"process {pid} ({comm}) holds {what}" for pid, comm, what, _ in found)



