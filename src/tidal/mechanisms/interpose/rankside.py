"""The interposer, inside a rank: a tearable ``torch.distributed`` default group and the consistent cut.

Loaded by Tidal's ``sitecustomize`` before user code, under a private module name, so it uses only the
standard library (torch is imported only once the script imports it). It talks to its agent over two
pipes (JSON lines) that survive checkpoint and restore: the agent hands the restored rank new pipes in
their place.

**The group.** ``init_process_group`` (any backend the script asks for, on CPU) returns a
:class:`TidalGroup`: a Python ``ProcessGroup`` that hands every collective to an inner
``ProcessGroupGloo`` untouched (same tensors, same order, the inner Work returned in a thin delegating
Work, so DDP overlaps as usual and results are bit-identical to ``torchrun``). The inner group can be
dropped before a dump (no socket left) and rebuilt after a restore from a rendezvous store hosted by
Tidal, not by rank 0.

**The cut.** Ops are counted per communicator (a group's collectives; one direction of a point-to-point
pair with one tag). Per rank and communicator, under one lock: ``announced`` = ops the script has
committed to issue (building a group counts as its first), ``issued`` = those handed to the inner group.
The agent's requests run on threads of this module, never on the script's, so they are answered even
while the script is blocked inside an op:

1. ``cut``: the rank sets *pending* and replies its counts. From then on the script may not announce an
   op beyond its communicator's target, which it does not know yet, so it waits at the gate.
2. ``target``: the targets per communicator (versioned). A script thread held at a target while the rank
   still owes ops elsewhere sends ``need`` (one more op there); the coordinator raises that target and
   sends new ones to every rank.
3. A rank replies ``parked`` (for a version) once issued = announced = target everywhere it belongs and
   every inner work has completed.
4. ``teardown`` drops every inner group; ``resume`` rebuilds them (a new store prefix, creation order)
   and opens the gate.

Why this ends, and ends consistent, is argued in docs/distributed.md ("The consistent cut") and checked on
a model in tests/unit/core/test_cutplan.py.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

# Loaded at the start of every Python process of a rank: only what the channel needs at once is imported
# here (json when the first request comes), so that a script's start-up is not slowed down noticeably.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime
    from typing import Any

UNSUPPORTED_ANYSOURCE = ("the job receives from any source (recv without src): such a receive cannot be "
                         "matched to its sender at a cut")

# Collectives handed to the inner group as they are, counted on the group's communicator.
COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "reduce", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "barrier", "gather", "scatter",
    "monitored_barrier",
)
P2P_OPS = ("send", "recv", "recv_anysource")
# ProcessGroup's names for collectives a backend calls otherwise (FSDP2 uses them).
ALIASES = {"all_gather_single": "_allgather_base", "reduce_scatter_single": "_reduce_scatter_base",
           "all_to_all_single": "alltoall_base"}


class Interposer:
    """One per rank process: the gate, the per-communicator counters and the agent channel.

    A *communicator* is what ops must be matched on: a process group (its collectives, in order) or one
    direction of a point-to-point pair of a group with one tag (its sends on one side, its receives on the
    other, in order). Keys are the same on every rank: torch names groups alike on every rank."""

    def __init__(self, rfd: int, wfd: int, store: str | None, prefix: str) -> None:
        self.rfd, self.wfd = rfd, wfd
        # The lock of ``cond``: every op takes it, directly (a Condition's ``with`` is a Python call).
        self.mutex = threading.RLock()
        self.cond = threading.Condition(self.mutex)
        self.announced: dict[str, int] = {}
        self.issued: dict[str, int] = {}
        self.members: dict[str, list[int]] = {}
        self.pending = False
        self.epoch: Any = None
        self.targets: dict[str, int] | None = None
        self.version = 0
        self.asked: set[tuple[str, int]] = set()  # (key, version) a raise was asked for
        self.works: list[Any] = []  # handed to the script and not known to have completed
        self._prune_at = 8  # works kept, at which those left are asked whether they completed
        self.unsupported: str | None = None
        self.store_addr = store  # "host:port" of the rendezvous store, changed by each resume
        self.base_prefix = prefix  # of the store keys: the launch's, or the last resume's with a store
        self.prefix = prefix  # of the store keys of the next (re)build
        self.groups: list[TidalGroupBase] = []  # in creation order: the same relative order on every rank
        self.default_key: str | None = None
        self.rank = -1  # in the world group
        self.steps = 0
        self.started = time.time()
        self._wlock = threading.Lock()

    @property
    def group(self) -> TidalGroupBase | None:
        return self.groups[0] if self.groups else None

    # -- the agent channel --------------------------------------------------------------------------
    def send(self, **msg: Any) -> None:
        import json

        self.write((json.dumps(msg) + "\n").encode())

    def write(self, data: bytes) -> None:
        with self._wlock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.wfd, view):]

    def serve(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self.rfd, 4096)
            except InterruptedError:
                continue
            if not chunk:
                return  # the agent is gone; the rank's init fences the rank
            buf += chunk
            import contextlib
            import json

            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    self.handle(json.loads(line))
                except Exception as exc:  # report, never kill the thread: the agent would wait forever
                    with contextlib.suppress(OSError):
                        self.send(op="error", epoch=None, error=f"{type(exc).__name__}: {exc}")

    def handle(self, msg: dict[str, Any]) -> None:
        op, epoch = msg.get("op"), msg.get("epoch")
        if op == "stat":
            with self.cond:
                self.send(op="stat", steps=self.steps, collectives=sum(self.issued.values()), since=self.started,
                          group=bool(self.groups))
        elif op == "cut":
            with self.cond:
                if self.unsupported:
                    self.send(op="unsupported", epoch=epoch, reason=self.unsupported)
                    return
                self.pending, self.targets, self.epoch, self.asked = True, None, epoch, set()
                comms = {k: [n, self.members[k]] for k, n in self.announced.items()}
                self.send(op="count", epoch=epoch, count=self.announced.get(self.default_key or "", 0),
                          default=self.default_key, comms=comms)
        elif op == "target":
            if "targets" in msg:
                targets = {str(k): int(v) for k, v in msg["targets"].items()}
                with self.cond:  # communicators this rank belongs to but has not used yet
                    for k, m in (msg.get("members") or {}).items():
                        if self.rank in m:
                            self.members.setdefault(str(k), [int(x) for x in m])
            else:  # a cut driven across nodes: the default group's count only
                targets = {self.default_key or "": int(msg["target"])}
            self._park(epoch, targets, int(msg.get("version", 0)))
        elif op == "teardown":
            with self.cond:
                groups = list(self.groups)
            left: list[str] = []
            if groups:
                opened = _drop_groups(groups)
                # CRIU cannot dump an internet socket (in any state, on Linux >= 6.16): none of the groups'
                # may outlive the teardown. One still closing is waited for; one that stays is named.
                left = _describe(_await_closed(opened, TEARDOWN_WAIT_S))
            if left:
                self.send(op="down", epoch=epoch, left=left)
            else:
                self.send(op="down", epoch=epoch)
        elif op == "resume":
            store = msg.get("store")
            if store:
                self.store_addr, self.base_prefix = store["addr"], store["prefix"]
                self.prefix = self.base_prefix
            groups = list(self.groups)
            if groups and msg.get("rebuild"):
                _drop_groups(groups)  # every rank is parked: nothing is in flight on them
            if any(g._inner is None for g in groups):
                if not store:
                    # The same store, fresh keys: every rank rebuilds at this epoch, so on the same prefix,
                    # whatever requests it saw before. A rank without a group yet keeps its prefix, as do
                    # ranks that had not loaded the interposer when the request came.
                    self.prefix = f"{self.base_prefix}/r{epoch}"
                # In creation order: every rank creates groups in the same order, so the first group not
                # rebuilt yet has all its members rebuilding it (no two ranks wait on each other).
                for g in groups:
                    if g._inner is None:
                        g._build_inner()
            with self.cond:
                self.pending, self.targets = False, None
                self.cond.notify_all()
            self.send(op="resumed", epoch=epoch)

    def _at_targets(self) -> bool:
        """Under ``cond``: every communicator has announced and issued exactly its target."""
        t = self.targets
        if t is None:
            return False
        return (all(n == t.get(k, 0) == self.issued.get(k, 0) for k, n in self.announced.items())
                and all(self.announced.get(k, 0) == n for k, n in t.items() if k in self.members))

    def _park(self, epoch: Any, targets: dict[str, int], version: int) -> None:
        with self.cond:
            self.targets, self.version = targets, version
            self.cond.notify_all()
        # Waiting happens on its own thread: this one must stay free to read a raised target.
        threading.Thread(target=self._parked, args=(epoch, version), name="tidal-park", daemon=True).start()

    def _parked(self, epoch: Any, version: int) -> None:
        with self.cond:
            while not self._at_targets():
                if self.version != version or not self.pending:
                    return
                over = [k for k, n in self.announced.items() if n > (self.targets or {}).get(k, 0)]
                if over:  # cannot happen: the gate holds each communicator at its target
                    self.send(op="error", epoch=epoch, error=f"rank passed the cut on {over[0]}")
                    return
                self.cond.wait()
            works = list(self.works)
        # A point-to-point work is waited on (once: TidalWork remembers it, and the script's own wait() then
        # returns at once, or waits for this one to end): gloo reports it completed only after a wait(), and
        # a script may wait on its sends only later (a pipeline schedule, after its last micro-batch's
        # forward), past the cut. Collectives are polled.
        delay = 0.001
        for w in works:
            if w._p2p:
                w.wait()
                continue
            while not _done(w):
                if delay >= 0.05:
                    # gloo's reduce-scatter never says it completed: a collective is waited on (again).
                    w.wait()
                    break
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        with self.cond:
            if self.version == version and self.pending:
                self.works = [w for w in self.works if not _done(w)]
                self.send(op="parked", epoch=epoch, version=version)

    # -- the gate (script threads) ------------------------------------------------------------------
    # Every op of the script passes here: the usual case (no cut pending, a communicator seen before) is
    # kept to a few lines, as each Python call on this path costs the workload (docs/distributed.md, "What the
    # interposer costs").
    def enter(self, key: str, members: list[int]) -> None:
        with self.mutex:
            if self.pending or key not in self.announced:
                self._gate(key, members)
            else:
                self.announced[key] += 1

    def _gate(self, key: str, members: list[int]) -> None:
        """Under ``mutex``: announce one more op on ``key`` once the cut pending, if any, lets it through."""
        self.members.setdefault(key, members)
        while self.pending and (self.targets is None or self.announced.get(key, 0) >= self.targets.get(key, 0)):
            if (self.targets is not None and (key, self.version) not in self.asked
                    and not self._at_targets()):
                # This rank owes ops on other communicators, and the next of them in its program
                # order comes after one more op here: the coordinator must let it through.
                self.asked.add((key, self.version))
                self.send(op="need", epoch=self.epoch, version=self.version, key=key, members=members,
                          count=self.announced.get(key, 0) + 1)
            self.cond.wait()
        self.announced[key] = self.announced.get(key, 0) + 1

    def leave(self, key: str, work: Any) -> None:
        with self.mutex:
            self.issued[key] = self.issued.get(key, 0) + 1
            if work is not None:
                works = self.works
                works.append(work)
                if len(works) >= self._prune_at:
                    # Completed works need no waiting at the cut, and must not keep their tensors alive: they
                    # are dropped once the list has doubled since the last time (those waited on are known
                    # from an attribute; the others are asked, a call to torch each).
                    works = self.works = [w for w in works if w._st != WAITED and not _done(w)]
                    self._prune_at = 2 * len(works) + 8
            if self.pending:  # only a cut waits on the counts (set under this lock)
                self.cond.notify_all()


TEARDOWN_WAIT_S = 10.0  # how long a teardown waits for the dropped groups' sockets to close


def _drop_groups(groups: list[TidalGroupBase]) -> set[str]:
    """Drop the inner group of each of ``groups`` (every rank parked); returns the sockets building them opened.

    Dropping them closes their sockets. Those still open are held by works the script keeps (all have
    completed), which then let go of their inner works, or by garbage: a full collection is a good part of a
    second in a process holding torch, so only if some are still open after that. Also before a rebuild
    without a dump: the next teardown looks only at the sockets of the groups built then."""
    opened: set[str] = set().union(*(g._opened for g in groups))
    for g in groups:
        g._drop_inner()
    if opened & _sockets():
        _let_go_of_works()
        if opened & _sockets():
            gc.collect()
    return opened


def _await_closed(sockets: set[str], timeout: float) -> set[str]:
    """Those of ``sockets`` still open after waiting up to ``timeout`` seconds for them to close."""
    left = sockets & _sockets()
    deadline = time.monotonic() + timeout
    delay = 0.001
    while left and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        left &= _sockets()
    return left


def _describe(sockets: set[str]) -> list[str]:
    """What each open socket of ``sockets`` ("socket:[inode]") is, read from a copy of its descriptor."""
    import contextlib
    import socket

    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") not in sockets:
                continue
            copy = os.dup(int(fd))
        except OSError:
            continue
        what = [f"fd {fd}"]
        try:
            with socket.socket(fileno=copy) as s:  # closes the copy
                what.append(f"{getattr(s.family, 'name', s.family)} {getattr(s.type, 'name', s.type)}")
                for arrow, end in (("", s.getsockname), ("-> ", s.getpeername)):
                    with contextlib.suppress(OSError):
                        what.append(f"{arrow}{end()}")
        except OSError:
            os.close(copy)
        out.append(" ".join(what))
    return sorted(out)


def _sockets() -> set[str]:
    """The sockets this process has open ("socket:[inode]")."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _after_fork_in_child() -> None:
    """In a process a rank forks (a DataLoader's worker, a ``multiprocessing`` fork): close its copies of the
    sockets the process groups opened. The child never uses them (a group is not fork-safe), but a copy
    keeps the connection open after the rank's teardown drops the group, and CRIU cannot dump it: the cut
    would fail on the child ("process ... (pt_data_worker) holds a TCP connection"). The parent's
    descriptors are not touched (closing a copy does not shut the connection down)."""
    ip = IP
    if ip is None:
        return
    # No lock: a thread of the parent that held it does not exist here.
    opened: set[str] = set()
    for group in list(ip.groups):
        opened |= getattr(group, "_opened", set())
    if not opened:
        return
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in opened:
                os.close(int(fd))
        except OSError:
            continue


def _done(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


class TidalGroupBase:
    """Typing anchor: the real class derives from torch's ProcessGroup and is made in :func:`_patch`."""

    _inner: Any
    _opened: set[str]  # the sockets opened while the inner group was built: its store's and its own
    _config: Any  # torch's backend config for the backend the script asked for
    _name: str  # and its name for the group's default backend

    def _drop_inner(self) -> None: ...

    def _build_inner(self) -> None: ...


IP: Interposer | None = None


# The state of a TidalWork's wait: none running, one running (the script's or the cut's), one returned True.
IDLE, WAITING, WAITED = 0, 1, 2
_CLAIM = threading.Lock()  # makes IDLE -> WAITING one step: a second wait() on a gloo P2P work blocks for ever
_WORK_TYPES: list[type] = []


def _make_work_class(dist: Any) -> type:
    class TidalWork(dist.Work):  # type: ignore[misc]
        """The inner group's work (``_w``), let go of at a teardown: a work the script keeps (the last ``isend``
        of a loop) would otherwise keep the inner group's connections open, and CRIU cannot dump them.

        One is made for every op, so it has no ``__init__`` of its own and its state is in class defaults:
        every Python call on an op's path costs the workload (docs/distributed.md, "What the interposer
        costs")."""

        _w: Any = None
        _p2p = False
        _st = IDLE
        _fut: Any = None

        def wait(self, timeout: Any = None) -> bool:
            # One wait() on the inner work at a time, and none once one returned: the cut waits on a
            # point-to-point work the script has not waited on yet (gloo says such a work completed only once
            # waited on), and a second wait() on it can block for ever (seen with torch.distributed.pipelining).
            w = self._w
            if self._st == WAITED or w is None:
                return True
            with _CLAIM:
                mine = self._st == IDLE
                if mine:
                    self._st = WAITING
            if not mine:
                return self._await_other(timeout)
            try:
                ok = bool(w.wait() if timeout is None else w.wait(timeout))
            except BaseException:
                self._st = IDLE
                raise
            self._st = WAITED if ok else IDLE
            return ok

        def _await_other(self, timeout: Any) -> bool:
            """Another thread is in the inner work's wait() (the cut, or a thread of the script): wait for it
            to end, then take over if it ended without the work done."""
            deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
            delay = 0.0005
            while self._st == WAITING:
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError("Tidal: timed out waiting for a work that another thread waits on")
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
            return self.wait(timeout)

        def is_completed(self) -> bool:
            w = self._w
            return w is None or self._st == WAITED or bool(w.is_completed())

        def is_success(self) -> bool:
            w = self._w
            return w is None or bool(w.is_success())

        def exception(self) -> Any:
            w = self._w
            return None if w is None else w.exception()

        def source_rank(self) -> int:
            return int(self._w._source_rank())

        _source_rank = source_rank  # what dist.recv without src asks

        def result(self) -> Any:
            return [] if self._w is None else self._w.result()  # let go of only once completed

        def get_future(self) -> Any:
            if self._fut is None and self._w is not None:
                self._fut = self._w.get_future()
            return self._fut

    _WORK_TYPES.append(TidalWork)
    return TidalWork


def _let_go_of_works() -> None:
    """Every work handed out lets go of its inner work: found among all objects, as works are many and this is
    needed only at a teardown that found a group's socket still open (a work the script keeps)."""
    kinds = set(_WORK_TYPES)
    for obj in gc.get_objects():
        # type(), not isinstance(): that reads __class__, which some objects compute, with side effects
        # (torch's deprecated ``reduce_op`` warns).
        if type(obj) in kinds:
            obj._w = None


def _make_group_class(dist: Any) -> type:
    gloo = dist.ProcessGroupGloo
    c10d = dist.distributed_c10d
    work_cls = _make_work_class(dist)

    class TidalGroup(dist.ProcessGroup, TidalGroupBase):  # type: ignore[misc]
        """A tearable group: the world (``ranks`` empty) or a sub-group, keyed by torch's group name; its
        inner group is gloo's or NCCL's (``inner``), as the script asked."""

        def __init__(self, rank: int, size: int, timeout: datetime.timedelta, key: str, ranks: list[int],
                     inner: str = "gloo") -> None:
            super().__init__(rank, size)
            self._inner_kind = inner
            self._rank, self._size, self._timeout = rank, size, timeout
            self._key, self._ranks = key, list(ranks) or list(range(size))
            self._world = not ranks
            self._inner: Any = None
            self._store: Any = None
            self._opened: set[str] = set()
            self._p2p_keys: dict[tuple[int, int, int], tuple[str, list[int]]] = {}
            self._config = _backend_config(dist, inner)  # torch's, for the backend the script asked for
            self._name = inner  # what torch names such a group's default backend

        def getBackendName(self) -> str:
            # For torch's C++ (DDP's logger looks a backend of this name up among the registered ones: none is).
            return "tidal"

        # What torch's Python says of the group is what it says under torchrun, for the backend the script asked
        # for (DCP's async_save, broadcast_from_rank0, Lightning's averaging and object collectives go by it).
        def name(self) -> str:
            return self._name

        _get_backend_name = name

        @property
        def _device_types(self) -> list[Any]:
            import torch

            # In torch's order for such a group: the device registered last first.
            return [torch.device(d) for d in reversed(self._config.get_device_backend_map())]

        def _get_backend(self, device: Any) -> Any:
            kind = getattr(device, "type", None) or str(device).split(":")[0]
            if self._inner is None or kind not in self._config.get_device_backend_map():
                raise RuntimeError(f"No backend type associated with device type {kind}")
            return self._inner

        # torch keeps a group's name on its backends, and a Python group has none: keep it here.
        @property
        def group_name(self) -> str:
            return self._key

        def _set_group_name(self, name: str) -> None:
            self._key = name
            self._p2p_keys.clear()  # they hold the name

        @property
        def group_desc(self) -> str:
            return getattr(self, "_desc", "undefined")

        def _set_group_desc(self, desc: str) -> None:
            self._desc = desc

        def _build_inner(self) -> None:
            assert IP is not None
            if not IP.store_addr:
                raise RuntimeError("Tidal: no rendezvous store for torch.distributed (TIDAL_STORE is unset)")
            host, port = IP.store_addr.rsplit(":", 1)
            before = _sockets()
            store = None
            try:
                store = dist.TCPStore(host, int(port), is_master=False, timeout=self._timeout)
                # Each group its own keys: sub-groups by torch's name for them, which every rank shares.
                prefix = IP.prefix if self._world else f"{IP.prefix}/g{self._key}"
                self._store = dist.PrefixStore(prefix, store)
                store = None
                if self._inner_kind == "nccl":
                    # Its communicator is made at the first collective, on the device of that tensor.
                    opts = dist.ProcessGroupNCCL.Options()
                    opts._timeout = self._timeout
                    self._inner = dist.ProcessGroupNCCL(self._store, self._rank, self._size, opts)
                else:
                    self._inner = gloo(self._store, self._rank, self._size, self._timeout)
            except BaseException:
                # Its connection to the store must not stay open (CRIU cannot dump it), not even held by
                # this frame in the exception's traceback.
                self._store = store = None
                raise
            finally:
                # Also on failure: a socket the attempt left open is the teardown's to wait for.
                self._opened = _sockets() - before

        def _drop_inner(self) -> None:
            inner, self._inner, self._store = self._inner, None, None
            if inner is not None:
                import contextlib

                with contextlib.suppress(Exception):
                    # NCCL: its communicators are destroyed and their device memory freed, so that the
                    # GPU's state can then be checkpointed (no communicator may be left).
                    inner.shutdown()
            del inner

        def _p2p_key(self, src: int, dst: int, tag: int) -> tuple[str, list[int]]:
            # Made once per pair and tag: a pipeline issues many point-to-point ops per step.
            found = self._p2p_keys.get((src, dst, tag))
            if found is None:
                a, b = self._ranks[src], self._ranks[dst]
                found = self._p2p_keys[(src, dst, tag)] = (f"{self._key}:{a}>{b}:{tag}", [a, b])
            return found

        def _call(self, key: str, members: list[int], name: str, args: Any, kw: Any) -> Any:
            ip = IP
            assert ip is not None
            ip.enter(key, members)
            work = None
            try:
                if self._inner_kind == "nccl" and not _NCCL_SEEN:
                    inner = _without_nccl_ras(lambda: getattr(self._inner, name)(*args, **kw))
                else:
                    inner = getattr(self._inner, name)(*args, **kw)
                if inner is not None:
                    work = work_cls()
                    work._w = inner
                    if name in P2P_OPS:
                        work._p2p = True
                return work
            finally:
                ip.leave(key, work)

        # The coalesced all-gather and reduce-scatter into tensors: torch's C++ functional collectives (DTensor's
        # full_tensor() and redistribution, FSDP2's full state dict) reach a Python group only through these, and
        # gloo binds no such method in Python. One op of the script's, made of the inner group's single-tensor op
        # per tensor, as gloo's own C++ makes its reduce-scatter (an all-gather moves the same bytes either way).
        def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
            return self._each("_allgather_base", outputs, inputs, opts or c10d.AllgatherOptions())

        def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
            return self._each("_reduce_scatter_base", outputs, inputs, opts or c10d.ReduceScatterOptions())

        all_gather_single_coalesced = allgather_into_tensor_coalesced  # torch's newer names for them
        reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

        def _each(self, single: str, outputs: Any, inputs: Any, opts: Any) -> Any:
            """``single`` on each pair of ``outputs`` and ``inputs``, counted as one op: all but the last are
            waited for here, so that the work handed out stands for them all."""
            ip = IP
            assert ip is not None
            ip.enter(self._key, self._ranks)
            work = None
            try:
                op = getattr(self._inner, single)
                for out, inp in zip(outputs[:-1], inputs[:-1]):  # noqa: B905 (any Python the job runs)
                    op(out, inp, opts).wait()
                work = work_cls()
                work._w = op(outputs[-1], inputs[-1], opts)
                return work
            finally:
                ip.leave(self._key, work)

        def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
            key, members = self._p2p_key(self._rank, dst, tag)
            return self._call(key, members, "send", (tensors, dst, tag), {})

        def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
            key, members = self._p2p_key(src, self._rank, tag)
            return self._call(key, members, "recv", (tensors, src, tag), {})

        def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
            assert IP is not None
            IP.unsupported = IP.unsupported or UNSUPPORTED_ANYSOURCE
            return self._call(self._key, self._ranks, "recv_anysource", (tensors, tag), {})

    def forward(name: str, inner: str) -> Any:
        def call(self: Any, *args: Any, **kw: Any) -> Any:
            return self._call(self._key, self._ranks, inner, args, kw)

        call.__name__ = name
        return call

    for name in COLLECTIVES:
        if hasattr(gloo, name):
            setattr(TidalGroup, name, forward(name, name))
    for name, inner in ALIASES.items():
        if hasattr(gloo, inner):
            setattr(TidalGroup, name, forward(name, inner))
    return TidalGroup


def _patch(dist: Any) -> None:
    """Route ``init_process_group`` through the Tidal group. Only names are replaced here: this runs
    while torch itself is still being imported, so anything heavier waits for the first call."""
    if getattr(dist, "_tidal_patched", False):
        return
    c10d = dist.distributed_c10d
    original = c10d.init_process_group
    original_helper = c10d._new_process_group_helper

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, store: Any = None, group_name: str = "",
                           pg_options: Any = None, device_id: Any = None, **kw: Any) -> Any:
        kind = inner_kind(backend)
        if kind is None:
            raise RuntimeError(f"Tidal runs torch.distributed with gloo or NCCL; backend {backend!r} is not "
                               "supported on this node")
        if rank == -1 and "RANK" not in os.environ and store is None:
            # Not started as a rank of torchrun's (a job submitted without ranks): torch says what is missing.
            return original(backend=backend, init_method=init_method, timeout=timeout, world_size=world_size,
                            rank=rank, store=store, group_name=group_name, pg_options=pg_options,
                            device_id=device_id, **kw)
        _register(dist)
        dist._tidal_asked = backend  # the default group's: its inner group, and what torch says of it
        if rank == -1:
            rank = int(os.environ["RANK"])
        if world_size == -1:
            world_size = int(os.environ["WORLD_SIZE"])
        # torch must not open a store of its own (rank 0 would host it): the real rendezvous happens in
        # the Tidal group's inner gloo group, on Tidal's store.
        return original(backend="tidal", timeout=timeout, world_size=world_size, rank=rank,
                        store=dist.HashStore(), group_name=group_name, device_id=device_id, **kw)

    def new_process_group_helper(group_size: int, group_rank: int, global_ranks_in_group: Any, backend: Any,
                                 *args: Any, **kw: Any) -> Any:
        # Every group (new_group, new_subgroups, a DeviceMesh dimension) is a Tidal group, even one asked
        # for with backend="gloo": torch would build that on the default group's store, which is a
        # local one here (rank 0 hosts no store under Tidal).
        asked = backend
        if getattr(dist, "_tidal_registered", False):
            if str(backend) == "tidal":  # the default group, for init_process_group
                kind, asked = inner_kind(dist._tidal_asked), dist._tidal_asked
            else:
                kind = inner_kind(backend)
            if kind is not None:
                backend = "tidal"
            dist._tidal_next_inner = kind  # read by the backend's constructor, called below
        pg, store = original_helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kw)
        if isinstance(pg, TidalGroupBase):
            # get_backend(), get_backend_config() and the group's device types answer as under torchrun, for the
            # backend the script asked for; a new_group without a backend then asks for the default group's,
            # which is made a Tidal group above.
            name = dist.Backend("undefined" if asked is None else str(asked))
            pg._config = _backend_config(dist, name)
            pg._name = _default_backend(dist, name, pg._config)
            c10d._world.pg_map[pg] = (name, store)
            c10d._world.pg_backend_config[pg] = str(pg._config)
        return pg, store

    init_process_group.__doc__ = original.__doc__
    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d._new_process_group_helper = new_process_group_helper
    dist._tidal_patched = True


_NCCL_SEEN: list[bool] = []  # not empty once this process's first NCCL communicator was made


def _without_nccl_ras(first: Any) -> Any:
    """Run the process's first NCCL collective (where NCCL starts) with NCCL's RAS off, unless the script's
    environment sets NCCL_RAS_ENABLE. RAS is a thread per process, started with the first communicator, that
    listens on TCP sockets until the process exits: no communicator teardown closes them, and CRIU cannot dump
    them. NCCL reads the variable once, so it is removed again at once: the script never sees it."""
    ours = "NCCL_RAS_ENABLE" not in os.environ
    if ours:
        os.environ["NCCL_RAS_ENABLE"] = "0"
    try:
        return first()
    finally:
        if ours:
            os.environ.pop("NCCL_RAS_ENABLE", None)
        _NCCL_SEEN.append(True)


_CONFIGS: dict[str, Any] = {}


def _backend_config(dist: Any, backend: str) -> Any:
    """torch's backend config for ``backend`` ("gloo": CPU and CUDA tensors; "nccl": CUDA), made once."""
    found = _CONFIGS.get(backend)
    if found is None:
        found = _CONFIGS[backend] = dist.distributed_c10d.BackendConfig(dist.Backend(backend))
    return found


def _default_backend(dist: Any, name: str, config: Any) -> str:
    """What torch names the default backend of a group asked for with ``name`` (``pg.name()``), decided as its
    ``_new_process_group_helper`` decides it, Tidal's own backend left out."""
    used = set(config.get_device_backend_map().values())
    if "," not in name and ":" not in name:
        if name == "undefined":
            return "nccl" if "nccl" in used else "gloo"
        return name
    if "nccl" in used:
        return "nccl"
    others = [k for k in dist.Backend._plugins if k != "TIDAL"]  # e.g. FAKE, registered by some imports
    if others:
        return "custom" if others[0].lower() in used else "undefined"
    return "gloo"


def inner_kind(backend: Any) -> str | None:
    """The inner group a backend name asks for ("gloo" or "nccl"); None for one Tidal cannot cut."""
    if backend is None:
        return "gloo"
    return {"gloo": "gloo", "cpu:gloo": "gloo", "nccl": "nccl", "cuda:nccl": "nccl",
            "undefined": "gloo"}.get(str(backend).lower())


def _register(dist: Any) -> None:
    """Register the ``tidal`` backend (once) and count optimizer steps for progress."""
    if getattr(dist, "_tidal_registered", False):
        return
    group_cls = _make_group_class(dist)

    def create(opts: Any, _options: Any) -> Any:
        assert IP is not None
        ranks = list(opts.global_ranks_in_group)
        key = str(opts.group_id)
        inner = getattr(dist, "_tidal_next_inner", None) or "gloo"
        dist._tidal_next_inner = None
        group = group_cls(opts.group_rank, opts.group_size, opts.timeout, key, ranks, inner)
        if not ranks:
            IP.default_key, IP.rank = key, int(opts.group_rank)
        # Building a group is a rendezvous of its members: it counts as their first op on it.
        IP.enter(key, group._ranks)
        try:
            group._build_inner()
            with IP.cond:
                IP.groups.append(group)
        finally:
            IP.leave(key, None)
        return group

    devices = ["cpu"]
    try:
        import torch

        if torch.cuda.is_available():  # gloo takes CUDA tensors too; NCCL only those
            devices.append("cuda")
    except Exception:
        pass
    dist.Backend.register_backend("tidal", create, extended_api=True, devices=devices)
    dist._tidal_registered = True
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def stepped(*_: Any) -> None:
            assert IP is not None
            IP.steps += 1

        register_optimizer_step_post_hook(stepped)
    except Exception:  # progress is a nicety; never break the script for it
        pass


class _Hook:
    """A meta-path finder that patches ``torch.distributed`` right after it is first imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def patched(module: Any) -> None:
            exec_module(module)
            if module.is_available():
                _patch(module)

        loader.exec_module = patched  # type: ignore[method-assign]
        return spec


def install(rfd: int, wfd: int) -> None:
    """Start the agent channel and arrange for ``torch.distributed`` to be patched when imported."""
    global IP
    IP = Interposer(rfd, wfd, os.environ.get("TIDAL_STORE"), os.environ.get("TIDAL_STORE_PREFIX", "tidal"))
    if "torch.distributed" in sys.modules:
        _patch(sys.modules["torch.distributed"])
    else:
        sys.meta_path.insert(0, _Hook())
    os.register_at_fork(after_in_child=_after_fork_in_child)
    IP.write(b'{"op": "hello", "pid": %d}\n' % os.getpid())
    threading.Thread(target=IP.serve, name="tidal-interposer", daemon=True).start()
