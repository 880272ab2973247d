"""The owner's side of the interposer channel, and the consistent cut over a job's ranks.

Each rank has two pipes to its owner (JSON lines): requests in, replies out. A rank whose first Python
process loaded the interposer says ``hello``; a rank that never does (not Python, or Python without the
interposer) has nothing to cut: it is frozen with the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidal.errors import CheckpointError, Unsupported
from tidal.mechanisms.criu.logpump import pump

_SEE_LOG = "the rank's log says why; the job's last good checkpoint is untouched"

class CutTimeout(CheckpointError):
    """A rank did not answer a step of the cut in time (stopped, or stuck outside any collective)."""


class RankChannel:
    def __init__(self, name: str, rfd: int, wfd: int) -> None:
        self.name = name
        self.rfd, self.wfd = rfd, wfd
        # CRIU's names of the two pipes (one inode for both ends of a pipe), for --inherit-fd at restore.
        self.keys = (f"pipe:[{os.fstat(wfd).st_ino}]", f"pipe:[{os.fstat(rfd).st_ino}]")
        self.hello = threading.Event()
        self.closed = threading.Event()
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._buf = b""
        self._lock = threading.Lock()
        self.last_stat: dict[str, Any] | None = None
        # Requests for a rank that has not loaded its interposer yet, sent when it says hello.
        self._hello_lock = threading.Lock()
        self._at_hello: list[dict[str, Any]] = []
        pump().add(rfd, self._on_data, self._on_eof)

    def _on_data(self, data: bytes) -> None:
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("op") == "hello":
                with self._hello_lock:  # what waited for it goes out before any request sent after it
                    for later in self._at_hello:
                        with contextlib.suppress(CheckpointError):
                            self.send(**later)
                    self._at_hello.clear()
                    self.hello.set()
            elif msg.get("op") == "stat":
                self.last_stat = msg
            else:
                self._replies.put(msg)

    def _on_eof(self) -> None:
        self.closed.set()
        self._replies.put({"op": "closed"})
        self.close()  # the rank is gone: nobody reads our requests any more

    def send(self, **msg: Any) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            if self.wfd < 0:
                raise CheckpointError(f"rank {self.name} has exited", object=self.name, hint=_SEE_LOG)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.wfd, view):]
            except OSError as exc:
                raise CheckpointError(f"rank {self.name}: its interposer channel is closed ({exc})",
                                      object=self.name, hint=_SEE_LOG) from exc

    def send_when_ready(self, **msg: Any) -> None:
        """Send now, or once the rank has loaded its interposer (it has not said hello yet)."""
        with self._hello_lock:
            if not self.hello.is_set():
                self._at_hello.append(msg)
                return
        self.send(**msg)

    def expect(self, ops: Sequence[str], epoch: int, deadline: float, what: str) -> dict[str, Any]:
        """The next reply of this epoch whose op is one of ``ops`` (``error`` raises)."""
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self._replies.get(timeout=max(0.0, left))
            except queue.Empty:
                raise CutTimeout(f"rank {self.name} did not {what} in time; is it stopped?",
                                 object=self.name, hint="the job goes on; its last good checkpoint is "
                                 "untouched") from None
            if msg.get("op") == "closed":
                raise CheckpointError(f"rank {self.name} exited during the cut", object=self.name, hint=_SEE_LOG)
            if msg.get("op") == "error":
                raise CheckpointError(f"rank {self.name}: interposer error: {msg.get('error')}", object=self.name,
                                      hint=_SEE_LOG)
            if msg.get("epoch") == epoch and msg.get("op") in ops:
                return msg
            # a reply of an earlier, abandoned epoch: skip it

    def request_stat(self) -> None:
        if self.hello.is_set() and not self.closed.is_set():
            with contextlib.suppress(CheckpointError):
                self.send(op="stat")

    def close(self) -> None:
        with self._lock:  # once: a closed number may already belong to another file
            fd, self.wfd = self.wfd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class Store:
    """Where ranks rebuild their group: the rendezvous store's address and a key prefix unique to one
    build (every rank of the job gets the same one)."""

    addr: str
    prefix: str

    def to_json(self) -> dict[str, str]:
        return {"addr": self.addr, "prefix": self.prefix}


_epochs = iter(range(1, 1 << 62))
_epoch_lock = threading.Lock()


def new_epoch() -> int:
    with _epoch_lock:
        return next(_epochs) + int(time.time() * 1000) % 1_000_000 * 1_000_000


def _live(channels: Sequence[RankChannel]) -> list[RankChannel]:
    return [c for c in channels if c.hello.is_set() and not c.closed.is_set()]


def counts(channels: Sequence[RankChannel], epoch: int, timeout: float) -> dict[str, int]:
    """Step 1 of the cut: every interposed rank stops announcing collectives and says how many it has."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="cut", epoch=epoch)
    out: dict[str, int] = {}
    refused: list[str] = []
    for c in live:
        msg = c.expect(("count", "unsupported"), epoch, deadline, "answer the checkpoint request")
        if msg["op"] == "unsupported":
            refused.append(f"rank {c.name}: {msg['reason']}")
        else:
            out[c.name] = int(msg["count"])
    if refused:
        raise Unsupported("this job cannot be checkpointed yet: " + "; ".join(refused),
                          hint="jobs with sub-groups or point-to-point operations (pipeline or tensor "
                               "parallelism) are not supported yet; the job goes on")
    return out


def park(channels: Sequence[RankChannel], epoch: int, target: int, timeout: float) -> None:
    """Step 2: every rank issues collectives up to ``target`` and waits for them; none goes further."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="target", epoch=epoch, target=target)
    for c in live:
        c.expect(("parked",), epoch, deadline, f"reach the cut at collective {target}")


def teardown(channels: Sequence[RankChannel], epoch: int, timeout: float) -> None:
    """Step 3 (every rank of the job parked): drop the process groups, so no socket is left to dump."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="teardown", epoch=epoch)
    for c in live:
        c.expect(("down",), epoch, deadline, "tear its process group down")


def resume(channels: Sequence[RankChannel], epoch: int, store: Store | None, timeout: float = 120,
           wait: bool = True, rebuild: bool = False) -> None:
    """Let every rank go on: rebuild its group if it was dropped (on ``store``; None: the same store,
    fresh keys) or if ``rebuild``, and open the gate. ``wait``: until every rank has done so."""
    live = _live(channels)
    for c in channels:
        # A rank that has not loaded its interposer yet (it was checkpointed early in its start) gets it
        # as soon as it has: it must build its group on the same store as the others.
        if not c.closed.is_set():
            c.send_when_ready(op="resume", epoch=epoch, store=store.to_json() if store else None, rebuild=rebuild)
    if not wait:
        return
    deadline = time.monotonic() + timeout
    for c in live:
        c.expect(("resumed",), epoch, deadline, "rebuild its process group")


def cut(channels: Sequence[RankChannel], epoch: int, timeout: float) -> int:
    """The whole cut when every rank is owned here: counts, target = the largest, park, tear down. On
    failure every rank is let go again (its group was dropped only if every rank had parked). Returns the
    target."""
    try:
        got = counts(channels, epoch, timeout)
        target = max(got.values(), default=0)
        park(channels, epoch, target, timeout)
    except BaseException:
        with contextlib.suppress(CheckpointError):  # a stopped rank reads its resume when continued
            resume(channels, epoch, None, wait=False)
        raise
    teardown(channels, epoch, timeout)
    return target
