"""A TCP relay on loopback that puts real faults between a client and a server: it resets connections,
answers requests with an HTTP 503 itself, or flips a byte of a request's body on the way."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

_S3_503 = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>ServiceUnavailable</Code>"
           b"<Message>Please reduce your request rate.</Message></Error>")


def _reset(s: socket.socket) -> None:
    """Close with an RST, as a crashed peer or a middlebox would."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.close()


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request's head and body (by Content-Length), or what came before the client gave up."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return data
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    # A client that expects 100 Continue sends its body only after it: answer at once.
    length = 0 if b"\r\nexpect:" in head.lower() else _content_length(head)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return head + b"\r\n\r\n" + body


class Relay:
    """Forwards 127.0.0.1:``port`` to ``upstream``. Faults are armed for the next connections it accepts
    (:meth:`reset_next`, :meth:`reject_next`) or the next requests it forwards (:meth:`corrupt_next`);
    :meth:`cut` resets every open connection, :meth:`clear` disarms what is left."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._faults: list[str] = []
        self._corrupt = 0
        self._open: set[socket.socket] = set()
        self.counts = {"accepted": 0, "reset": 0, "rejected": 0, "corrupted": 0}
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()

    def reset_next(self, n: int = 1) -> None:
        with self._lock:
            self._faults += ["reset"] * n

    def reject_next(self, n: int = 1) -> None:
        with self._lock:
            self._faults += ["reject"] * n

    def corrupt_next(self, n: int = 1) -> None:
        """Flip the first byte of the body of each of the next ``n`` requests that have one."""
        with self._lock:
            self._corrupt += n

    def clear(self) -> None:
        with self._lock:
            self._faults, self._corrupt = [], 0

    def cut(self) -> None:
        """Reset every connection now open (a client's pooled connections go with them)."""
        with self._lock:
            doomed, self._open = self._open, set()
        for s in doomed:
            _reset(s)

    def pending(self) -> int:
        with self._lock:
            return len(self._faults)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.counts["accepted"] += 1
                fault = self._faults.pop(0) if self._faults else None
            threading.Thread(target=self._serve, args=(conn, fault), daemon=True, name="relay-conn").start()

    def _serve(self, conn: socket.socket, fault: str | None) -> None:
        if fault == "reset":
            with self._lock:
                self.counts["reset"] += 1
            _reset(conn)
            return
        if fault == "reject":
            with contextlib.suppress(OSError):
                _read_request(conn)
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_S3_503), _S3_503))
                with self._lock:
                    self.counts["rejected"] += 1
            with contextlib.suppress(OSError):
                conn.close()
            return
        try:
            up = socket.create_connection(self.upstream)
        except OSError:
            _reset(conn)
            return
        with self._lock:
            self._open.update((conn, up))
        threading.Thread(target=self._pump, args=(up, conn, False), daemon=True).start()
        self._pump(conn, up, True)

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        """Copy src to dst; ``requests``: src is the client, whose requests are followed (those that follow
        each other on a kept-alive connection too) so that an armed corruption flips the first byte of a body.
        Heads go through untouched and at once: a client may wait for ``100 Continue`` before its body."""
        head = b""
        body_left = 0  # bytes of the current request's body still to come
        flip = False  # the next body byte is to be flipped
        try:
            for data in _chunks(src):
                if requests:
                    out = bytearray()
                    rest = data
                    while rest:
                        if body_left > 0:
                            take = rest[:body_left]
                            if flip:
                                take = bytes([take[0] ^ 0xFF]) + take[1:]
                                flip = False
                                with self._lock:
                                    self.counts["corrupted"] += 1
                            out += take
                            body_left -= len(take)
                            rest = rest[len(take):]
                            continue
                        head += rest
                        end = head.find(b"\r\n\r\n")
                        if end < 0:
                            out += rest
                            break
                        used = len(rest) - (len(head) - (end + 4))
                        out += rest[:used]
                        rest = rest[used:]
                        body_left = _content_length(head[:end])
                        head = b""
                        with self._lock:
                            flip = body_left > 0 and self._corrupt > 0
                            self._corrupt -= flip
                    data = bytes(out)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _chunks(s: socket.socket) -> Iterator[bytes]:
    while True:
        data = s.recv(65536)
        if not data:
            return
        yield data
