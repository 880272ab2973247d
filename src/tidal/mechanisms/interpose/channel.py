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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.core.cutplan import Need, Plan, Report
from tidal.errors import CheckpointError, TidalError, Unsupported
from tidal.mechanisms.criu.logpump import pump

_SEE_LOG = "the rank's log says why; the job's last good checkpoint is untouched"
# Notified on every reply of any rank: the cut over several communicators listens to all ranks at once.
_replied = threading.Condition()

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
                self._put(msg)

    def _put(self, msg: dict[str, Any]) -> None:
        self._replies.put(msg)
        with _replied:
            _replied.notify_all()

    def _on_eof(self) -> None:
        self.closed.set()
        self._put({"op": "closed"})
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


def _ask_counts(channels: Sequence[RankChannel], epoch: int, timeout: float) -> dict[str, dict[str, Any]]:
    """Step 1 of the cut: every interposed rank stops announcing ops and says how many it has, per
    communicator. A rank whose job cannot be cut says why."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="cut", epoch=epoch)
    out: dict[str, dict[str, Any]] = {}
    refused: list[str] = []
    for c in live:
        msg = c.expect(("count", "unsupported"), epoch, deadline, "answer the checkpoint request")
        if msg["op"] == "unsupported":
            refused.append(f"rank {c.name}: {msg['reason']}")
        else:
            out[c.name] = msg
    if refused:
        raise Unsupported("this job cannot be checkpointed: " + "; ".join(refused),
                          hint="receive from a named source (dist.recv(t, src=...)) to make it checkpointable; "
                               "the job goes on")
    return out


def report(channels: Sequence[RankChannel], epoch: int, timeout: float) -> Report:
    """Step 1 of a cut driven across nodes, over every communicator: what the ranks here announced."""
    out = Report()
    for name, msg in _ask_counts(channels, epoch, timeout).items():
        out.add(name.rsplit(".r", 1)[-1], {k: (int(n), m) for k, (n, m) in (msg.get("comms") or {}).items()},
                msg.get("default"))
    return out


def wake() -> None:
    """Wake every cut waiting for replies (so that it sees it was superseded)."""
    with _replied:
        _replied.notify_all()


#: After a first need, how long a park round goes on gathering the needs of the node's other ranks before it
#: answers (each answer with needs costs a round through the control plane).
NEED_GATHER_S = 0.1


def park_round(channels: Sequence[RankChannel], epoch: int, plan: Plan, timeout: float,
               superseded: Callable[[], bool] = lambda: False) -> list[Need] | None:
    """One round of step 2 across nodes: the ranks here run to the plan's targets. Returns [] once every one
    has parked at them, or the needs they raised beyond them (then the targets must be raised on every node:
    ranks elsewhere may be waiting for these), or None once ``superseded()`` (a newer round came)."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="target", epoch=epoch, **plan.message())
    parked: set[str] = set()
    needs: dict[str, Need] = {}
    needing: set[str] = set()
    gather_until = float("inf")
    while len(parked) < len(live):
        if superseded():
            return None
        if needs and (time.monotonic() >= gather_until or len(parked | needing) == len(live)):
            break
        waiting = [c.name for c in live if c.name not in parked]
        got = _next_reply(live, min(deadline, gather_until), waiting, until=superseded,
                          timeout_at=deadline)
        if got is None:
            continue
        c, msg = got
        op = msg.get("op")
        _refuse_failed(c, op, msg)
        if msg.get("epoch") != epoch:
            continue
        if op == "need":
            key, count = str(msg["key"]), int(msg["count"])
            if count > plan.targets.get(key, 0) and count > (needs[key].count if key in needs else 0):
                needs[key] = Need(key, tuple(int(m) for m in msg["members"]), count)
                needing.add(c.name)
                gather_until = min(gather_until, time.monotonic() + NEED_GATHER_S)
        elif op == "parked" and int(msg.get("version", 0)) == plan.version:
            parked.add(c.name)
    return sorted(needs.values(), key=lambda n: n.key) if len(parked) < len(live) else []


def park(channels: Sequence[RankChannel], epoch: int, target: int, timeout: float) -> None:
    """Step 2 of a cut across nodes: every rank issues world-group collectives up to ``target`` and waits
    for them; none goes further."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="target", epoch=epoch, target=target)
    for c in live:
        c.expect(("parked",), epoch, deadline, f"reach the cut at collective {target}")


def _refuse_failed(c: RankChannel, op: Any, msg: dict[str, Any]) -> None:
    """A rank's reply during the cut that ends it: the rank exited, or its interposer failed."""
    if op == "closed":
        raise CheckpointError(f"rank {c.name} exited during the cut", object=c.name, hint=_SEE_LOG)
    if op == "error":
        raise CheckpointError(f"rank {c.name}: interposer error: {msg.get('error')}", object=c.name,
                              hint=_SEE_LOG)


def _next_reply(live: Sequence[RankChannel], deadline: float, waiting: Sequence[str],
                until: Callable[[], bool] = lambda: False,
                timeout_at: float | None = None) -> tuple[RankChannel, dict[str, Any]] | None:
    """The next reply of any rank. None at ``deadline`` or once ``until()``, if ``timeout_at`` is later;
    a CutTimeout at ``timeout_at`` (default: ``deadline``)."""
    timeout_at = deadline if timeout_at is None else timeout_at
    with _replied:
        while True:
            for c in live:
                with contextlib.suppress(queue.Empty):
                    return c, c._replies.get_nowait()
            t = time.monotonic()
            if t >= timeout_at:
                raise CutTimeout(f"rank {waiting[0]} did not reach the cut in time; is it stopped?",
                                 object=waiting[0], hint="the job goes on; its last good checkpoint is untouched")
            if t >= deadline or until():
                return None
            _replied.wait(min(deadline - t, 1.0))


def park_all(channels: Sequence[RankChannel], epoch: int, plan: Plan, timeout: float) -> None:
    """Step 2 when every rank is owned here: each rank issues ops up to the targets of every
    communicator and waits for them; a rank held on one communicator while it owes ops on another gets
    that target raised (to every rank), until all have parked at the same targets."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="target", epoch=epoch, **plan.message())
    parked: dict[str, int] = {}
    while len([n for n, v in parked.items() if v == plan.version]) < len(live):
        waiting = [c.name for c in live if parked.get(c.name) != plan.version]
        got = _next_reply(live, deadline, waiting)
        assert got is not None
        c, msg = got
        op = msg.get("op")
        _refuse_failed(c, op, msg)
        if msg.get("epoch") != epoch:
            continue
        if op == "need" and plan.need(str(msg["key"]), msg["members"], int(msg["count"])):
            for other in live:
                other.send(op="target", epoch=epoch, **plan.message())
        elif op == "parked":
            parked[c.name] = int(msg.get("version", 0))


def teardown(channels: Sequence[RankChannel], epoch: int, timeout: float) -> None:
    """Step 3 (every rank of the job parked): drop the process groups, so no socket is left to dump. A rank
    whose groups left a socket open (CRIU cannot dump it) names it: the checkpoint fails before anything
    is frozen."""
    live = _live(channels)
    deadline = time.monotonic() + timeout
    for c in live:
        c.send(op="teardown", epoch=epoch)
    left: dict[str, list[str]] = {}
    for c in live:
        msg = c.expect(("down",), epoch, deadline, "tear its process group down")
        if msg.get("left"):
            left[c.name] = [str(s) for s in msg["left"]]
    if left:
        raise CheckpointError("sockets opened while the job's process groups were built are still open after their "
                              "teardown, and CRIU cannot checkpoint them: "
                              + "; ".join(f"rank {name}: {', '.join(socks)}" for name, socks in left.items()),
                              object=next(iter(left)), hint="the job goes on; its last good checkpoint is untouched")


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


def rebuilt(channels: Sequence[RankChannel], epoch: int, timeout: float) -> bool:
    """Whether every rank let go at ``epoch`` (:func:`resume`, ``wait=False``) has rebuilt its group and gone on
    within ``timeout`` seconds; never an error (a rank that did not is the cut's next concern, not this)."""
    deadline = time.monotonic() + timeout
    try:
        for c in _live(channels):
            c.expect(("resumed",), epoch, deadline, "rebuild its process group")
    except TidalError:
        return False
    return True


def cut(channels: Sequence[RankChannel], epoch: int, timeout: float) -> int:
    """The whole cut when every rank is owned here: counts, targets, park, tear down. On failure every rank
    is let go again (its groups were dropped only if every rank had parked: it rebuilds them). Returns the
    world group's target."""
    try:
        got = _ask_counts(channels, epoch, timeout)
        plan = Plan.from_counts({k: (int(n), m) for k, (n, m) in (msg.get("comms") or {}).items()}
                                for msg in got.values())
        park_all(channels, epoch, plan, timeout)
        default = next((msg.get("default") for msg in got.values() if msg.get("default")), None)
        target = plan.targets.get(default, 0) if default else 0
        teardown(channels, epoch, timeout)
    except BaseException:
        # A stopped rank reads its resume when continued; a rank whose groups were dropped rebuilds them.
        with contextlib.suppress(CheckpointError):
            resume(channels, epoch, None, wait=False)
        raise
    return target
