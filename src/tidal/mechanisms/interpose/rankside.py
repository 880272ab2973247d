"""The interposer, inside a rank: a tearable ``torch.distributed`` default group and the consistent cut.

Loaded by Tidal's ``sitecustomize`` before user code, under a private module name, so it uses only the
standard library (torch is imported only once the script imports it). It talks to its agent over two
pipes (JSON lines) that survive checkpoint and restore: the agent hands the restored rank new pipes in
their place.

**The group.** ``init_process_group`` (any backend the script asks for, on CPU) returns a
:class:`TidalGroup`: a Python ``ProcessGroup`` that hands every collective to an inner
``ProcessGroupGloo`` untouched (same tensors, same order, the inner Work returned as is, so DDP overlaps
as usual and results are bit-identical to ``torchrun``). The inner group can be dropped before a dump
(no socket left) and rebuilt after a restore from a rendezvous store hosted by Tidal, not by rank 0.

**The cut.** Per rank, under one lock: ``announced`` = collectives the script has committed to issue
(``init_process_group`` counts as the first), ``issued`` = those handed to the inner group. The agent's
request runs on a thread of this module, never on the script's thread, so it is answered even while the
script is blocked inside a collective:

1. ``cut``: the rank sets *pending* and replies ``announced`` = c_r. From then on the script may not
   announce a collective beyond the target, which it does not know yet, so it waits at the gate.
2. The coordinator sets T = max c_r and sends ``target T``. Every rank may now announce up to T.
3. A rank replies ``parked`` once issued = announced = T and every inner work has completed.
4. ``teardown`` drops the inner group; ``resume`` rebuilds it (a new store prefix) and opens the gate.

Why it cannot deadlock: all ranks issue the same sequence of collectives on the default group (sub-groups
and point-to-point refuse the cut, below). Collective k completes once every rank has issued it. Before
T is known a rank can block only at the gate (it then has issued all it announced, ≤ c_r ≤ T) or inside a
collective k ≤ c_r. After ``target T`` every rank can issue every collective up to T, since the gate
lets through all k ≤ T and each rank had announced at least k-1 ≤ T-1 of them; so each k ≤ T is issued by
all ranks and completes; none issues T+1. Announcing and reading *pending* happen under the same lock as
the reply, so a script thread descheduled between the check and the call has already been counted. The
replies come from this module's thread, which waits on nothing but the pipe and (for ``parked``) works
that are bound to complete, so the coordinator always gets them unless a rank is stopped (it times out
then, and ``resume`` lets every rank go on).
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

UNSUPPORTED_SUBGROUPS = "the job uses sub-groups (torch.distributed.new_group)"
UNSUPPORTED_P2P = "the job uses point-to-point operations (send/recv)"

# Collectives handed to the inner group as they are; p2p marks the job as not cuttable.
COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "reduce", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "barrier", "gather", "scatter",
    "monitored_barrier",
)
P2P = ("send", "recv", "recv_anysource")


class Interposer:
    """One per rank process: the gate, the counters and the agent channel."""

    def __init__(self, rfd: int, wfd: int, store: str | None, prefix: str) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.cond = threading.Condition()
        self.announced = 0
        self.issued = 0
        self.pending = False
        self.target: int | None = None
        self.works: list[Any] = []
        self.unsupported: str | None = None
        self.store_addr = store  # "host:port" of the rendezvous store, changed by each resume
        self.base_prefix = prefix  # of the store keys: the launch's, or the last resume's with a store
        self.prefix = prefix  # of the store keys of the next (re)build
        self.group: TidalGroupBase | None = None
        self.steps = 0
        self.subgroups = 0
        self.started = time.time()
        self._wlock = threading.Lock()

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
                self.send(op="stat", steps=self.steps, collectives=self.issued, since=self.started,
                          group=self.group is not None)
        elif op == "cut":
            with self.cond:
                if self.unsupported:
                    self.send(op="unsupported", epoch=epoch, reason=self.unsupported)
                    return
                self.pending, self.target = True, None
                self.send(op="count", epoch=epoch, count=self.announced)
        elif op == "target":
            self._park(epoch, int(msg["target"]))
        elif op == "teardown":
            with self.cond:
                group = self.group
            if group is not None:
                ours = _sockets() - group._older_sockets  # the group's, and any opened since it was built
                group._drop_inner()
                # Dropping the group closes its sockets; a full collection (a good part of a second in a
                # process holding torch) only if some are still open.
                if ours & _sockets():
                    gc.collect()
            self.send(op="down", epoch=epoch)
        elif op == "resume":
            store = msg.get("store")
            if store:
                self.store_addr, self.base_prefix = store["addr"], store["prefix"]
                self.prefix = self.base_prefix
            group = self.group
            if group is not None and msg.get("rebuild") and group._inner is not None:
                group._drop_inner()  # every rank is parked: nothing is in flight on it
            if group is not None and group._inner is None:
                if not store:
                    # The same store, fresh keys: every rank rebuilds at this epoch, so on the same prefix,
                    # whatever requests it saw before. A rank without a group yet keeps its prefix, as do
                    # ranks that had not loaded the interposer when the request came.
                    self.prefix = f"{self.base_prefix}/r{epoch}"
                group._build_inner()
            with self.cond:
                self.pending, self.target = False, None
                self.cond.notify_all()
            self.send(op="resumed", epoch=epoch)

    def _park(self, epoch: Any, target: int) -> None:
        with self.cond:
            self.target = target
            self.cond.notify_all()
            while not (self.issued == self.announced == target):
                if self.announced > target:  # cannot happen: the gate holds at the target
                    self.send(op="error", epoch=epoch, error=f"rank passed the cut ({self.announced} > {target})")
                    return
                self.cond.wait()
            works, self.works = self.works, []
        for w in works:
            w.wait()
        self.send(op="parked", epoch=epoch)

    # -- the gate (script threads) ------------------------------------------------------------------
    def enter(self) -> None:
        with self.cond:
            while self.pending and (self.target is None or self.announced >= self.target):
                self.cond.wait()
            self.announced += 1

    def leave(self, work: Any) -> None:
        with self.cond:
            self.issued += 1
            if work is not None:
                # Completed works need no waiting at the cut: keep the list short.
                self.works = [w for w in self.works if not _done(w)]
                self.works.append(work)
            self.cond.notify_all()


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


def _done(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


class TidalGroupBase:
    """Typing anchor: the real class derives from torch's ProcessGroup and is made in :func:`_patch`."""

    _inner: Any
    _older_sockets: set[str]  # the sockets the process had before the inner group was built

    def _drop_inner(self) -> None: ...

    def _build_inner(self) -> None: ...


IP: Interposer | None = None


def _make_group_class(dist: Any) -> type:
    gloo = dist.ProcessGroupGloo

    class TidalGroup(dist.ProcessGroup, TidalGroupBase):  # type: ignore[misc]
        def __init__(self, rank: int, size: int, timeout: datetime.timedelta) -> None:
            super().__init__(rank, size)
            self._rank, self._size, self._timeout = rank, size, timeout
            self._inner: Any = None
            self._store: Any = None
            self._older_sockets: set[str] = set()

        def getBackendName(self) -> str:
            return "tidal"

        def _build_inner(self) -> None:
            assert IP is not None
            if not IP.store_addr:
                raise RuntimeError("Tidal: no rendezvous store for torch.distributed (TIDAL_STORE is unset)")
            host, port = IP.store_addr.rsplit(":", 1)
            self._older_sockets = _sockets()
            store = dist.TCPStore(host, int(port), is_master=False, timeout=self._timeout)
            self._store = dist.PrefixStore(IP.prefix, store)
            self._inner = gloo(self._store, self._rank, self._size, self._timeout)

        def _drop_inner(self) -> None:
            inner, self._inner, self._store = self._inner, None, None
            if inner is not None:
                import contextlib

                with contextlib.suppress(Exception):
                    inner.shutdown()
            del inner

    def forward(name: str, p2p: bool) -> Any:
        def call(self: Any, *args: Any, **kw: Any) -> Any:
            assert IP is not None
            if p2p and IP.unsupported is None:
                IP.unsupported = UNSUPPORTED_P2P
            IP.enter()
            work = None
            try:
                work = getattr(self._inner, name)(*args, **kw)
                return work
            finally:
                IP.leave(work)

        call.__name__ = name
        return call

    for name in COLLECTIVES + P2P:
        if hasattr(gloo, name):
            setattr(TidalGroup, name, forward(name, name in P2P))
    return TidalGroup


def _patch(dist: Any) -> None:
    """Route ``init_process_group`` through the Tidal group. Only names are replaced here: this runs
    while torch itself is still being imported, so anything heavier waits for the first call."""
    if getattr(dist, "_tidal_patched", False):
        return
    c10d = dist.distributed_c10d
    original = c10d.init_process_group
    original_new_group = c10d.new_group

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, store: Any = None, group_name: str = "",
                           pg_options: Any = None, device_id: Any = None, **kw: Any) -> Any:
        if backend not in (None, "gloo", "cpu:gloo") and str(backend) != "gloo":
            raise RuntimeError(f"Tidal runs torch.distributed on CPU with gloo; backend {backend!r} is not "
                               "supported on this node")
        _register(dist)
        if rank == -1:
            rank = int(os.environ["RANK"])
        if world_size == -1:
            world_size = int(os.environ["WORLD_SIZE"])
        # torch must not open a store of its own (rank 0 would host it): the real rendezvous happens in
        # the Tidal group's inner gloo group, on Tidal's store.
        return original(backend="tidal", timeout=timeout, world_size=world_size, rank=rank,
                        store=dist.HashStore(), group_name=group_name, device_id=device_id, **kw)

    def new_group(*args: Any, **kw: Any) -> Any:
        assert IP is not None
        IP.unsupported = IP.unsupported or UNSUPPORTED_SUBGROUPS
        return original_new_group(*args, **kw)

    init_process_group.__doc__ = original.__doc__
    new_group.__doc__ = original_new_group.__doc__
    c10d.init_process_group = dist.init_process_group = init_process_group
    c10d.new_group = dist.new_group = new_group
    dist._tidal_patched = True


def _register(dist: Any) -> None:
    """Register the ``tidal`` backend (once) and count optimizer steps for progress."""
    if getattr(dist, "_tidal_registered", False):
        return
    group_cls = _make_group_class(dist)
    first = [True]

    def create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
        assert IP is not None
        if not first[0]:  # a sub-group: a plain gloo group on the Tidal store; such a job cannot be cut
            IP.unsupported = IP.unsupported or UNSUPPORTED_SUBGROUPS
            host, port = (IP.store_addr or "").rsplit(":", 1)
            IP.subgroups += 1  # every rank creates sub-groups in the same order: the same prefix
            real = dist.PrefixStore(f"{IP.prefix}/sub{IP.subgroups}",
                                    dist.TCPStore(host, int(port), is_master=False, timeout=timeout))
            return dist.ProcessGroupGloo(real, rank, size, timeout)
        first[0] = False
        group = group_cls(rank, size, timeout)
        IP.enter()  # building the group is a rendezvous of every rank: it counts as a collective
        try:
            group._build_inner()
            IP.group = group
        finally:
            IP.leave(None)
        return group

    dist.Backend.register_backend("tidal", create, devices=["cpu"])
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
    IP.write(b'{"op": "hello", "pid": %d}\n' % os.getpid())
    threading.Thread(target=IP.serve, name="tidal-interposer", daemon=True).start()
