"""Moves a rank's output from its pipe into its log file, and exposes a drain for the checkpoint.

One thread per owner process serves every rank's pipes. Read and write happen under one lock and
reads never block, so after the rank is frozen, :meth:`LogPump.drain` leaves nothing in flight: the
log size it returns is exactly what the rank had written when it was frozen.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_READ = 1 << 16


@dataclass
class _Stream:
    fd: int
    sink: Callable[[bytes], None]
    on_eof: Callable[[], None] | None
    closed: threading.Event = field(default_factory=threading.Event)


class LogPump:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sel = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="tidal-logpump", daemon=True)
        self._thread.start()

    def add(self, fd: int, sink: Callable[[bytes], None],
            on_eof: Callable[[], None] | None = None) -> threading.Event:
        """Pump ``fd`` into ``sink``; the event is set once it reached its end and was closed (wait on it,
        not on the number: a closed number is soon another pipe's)."""
        os.set_blocking(fd, False)
        stream = _Stream(fd, sink, on_eof)
        with self._lock:
            self._streams[fd] = stream
            self._sel.register(fd, selectors.EVENT_READ)
        os.write(self._wake_w, b"x")
        return stream.closed

    def add_file(self, fd: int, path: Path, on_eof: Callable[[], None] | None = None) -> threading.Event:
        out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

        def sink(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]

        def eof() -> None:
            os.close(out)
            if on_eof:
                on_eof()

        return self.add(fd, sink, eof)

    def drain(self, fd: int) -> None:
        """Read and deliver everything currently in the pipe (the writer must be stopped)."""
        with self._lock:
            stream = self._streams.get(fd)
            if stream is not None:
                self._pump(stream)

    def _pump(self, stream: _Stream) -> None:
        while True:
            try:
                data = os.read(stream.fd, _READ)
            except BlockingIOError:
                return
            if not data:
                self._close(stream)
                return
            stream.sink(data)

    def _close(self, stream: _Stream) -> None:
        self._sel.unregister(stream.fd)
        del self._streams[stream.fd]
        os.close(stream.fd)
        try:
            if stream.on_eof:
                stream.on_eof()
        finally:
            stream.closed.set()

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                with self._lock:
                    stream = self._streams.get(int(key.fd))
                    if stream is not None:
                        self._pump(stream)


_PUMP: LogPump | None = None
_PUMP_LOCK = threading.Lock()


def pump() -> LogPump:
    """The owner process's pump (one thread for all ranks)."""
    global _PUMP
    with _PUMP_LOCK:
        if _PUMP is None:
            _PUMP = LogPump()
        return _PUMP
