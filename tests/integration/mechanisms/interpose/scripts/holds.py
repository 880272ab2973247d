"""Holds what CRIU cannot checkpoint, then ticks: ``--tcp HOST:PORT`` a connection to that service,
``--io-uring`` an io_uring instance (made with the raw system call), ``--listen`` a listening TCP socket,
``--udp`` a bound UDP socket, ``--unconnected`` a TCP socket never connected. Prints ``tick N`` every 50 ms."""

from __future__ import annotations

import argparse
import ctypes
import socket
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tcp", default=None)
    ap.add_argument("--io-uring", action="store_true")
    ap.add_argument("--listen", action="store_true")
    ap.add_argument("--udp", action="store_true")
    ap.add_argument("--unconnected", action="store_true")
    ap.add_argument("--ticks", type=int, default=400)
    args = ap.parse_args()
    held = []
    if args.tcp:
        host, port = args.tcp.rsplit(":", 1)
        held.append(socket.create_connection((host, int(port))))
    if args.io_uring:
        params = ctypes.create_string_buffer(120)
        fd = ctypes.CDLL(None, use_errno=True).syscall(425, 4, params)  # io_uring_setup
        if fd < 0:
            raise SystemExit(f"io_uring_setup failed: errno {ctypes.get_errno()}")
        held.append(fd)
    if args.listen:
        held.append(socket.create_server(("127.0.0.1", 0)))
    if args.udp:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        held.append(udp)
    if args.unconnected:
        held.append(socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
    print("holding", flush=True)
    for i in range(args.ticks):
        print(f"tick {i}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
