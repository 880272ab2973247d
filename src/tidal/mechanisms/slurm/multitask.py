"""``tidal run`` over the several tasks of a Slurm step (``srun -N 2 --ntasks-per-node 1 tidal run
--ranks-per-node K ...``): one task per node, each running its node's K ranks.

Task 0 is the coordinator; nothing outside the step runs. It hosts the ranks' rendezvous store and listens
for the other tasks (:mod:`~tidal.mechanisms.slurm.stepchannel`), and publishes where, with a fresh secret,
in the checkpoint store, which every task reaches and only the job's owner reads (``steps/KEY/RUN.json``,
RUN: the Slurm job id and its restart count). Each other task reads it there, connects and proves it knows
the secret.

The coordinator decides how the step starts: from the step's last committed checkpoint (every task restores
its own ranks: task ``i`` always holds ranks ``i*K`` to ``i*K+K-1``, on whatever node Slurm gave it) or
anew. On Slurm's signal at any task, it takes a checkpoint over all tasks in the steps the control plane
uses over several nodes (``report``, ``park`` rounds over every communicator, ``dump``, ``finish``;
docs/distributed.md): each task dumps
its ranks as its own part (``CK.pTASK`` under the job's key); once every part is stored, the coordinator
commits the step checkpoint, a record naming the parts (under the key ``KEY.step``), and only then are the
ranks killed. A checkpoint that fails anywhere leaves the last committed one as it was.
"""

from __future__ import annotations

import contextlib
import json
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidal.core import limits
from tidal.core.cutplan import Need, Plan
from tidal.errors import CheckpointError, MechanismError, TidalError, ValidationError
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.interpose.channel import Store, new_epoch
from tidal.mechanisms.slurm import scontrol
from tidal.mechanisms.slurm.stepchannel import ChannelClosed, Connection, accept, connect
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.manifest import check_id, new_checkpoint_id, sequence_of
from tidal.waiting import wait_until

if TYPE_CHECKING:
    from tidal.mechanisms.slurm.runner import Site, SlurmRun

START_TIMEOUT_S = 180.0  # for every task of the step to be up and connected (Slurm starts them together)
CUT_TIMEOUT_S = 120.0  # per step of a cut (counts, park, finish)
DUMP_TIMEOUT_S = 900.0  # a dump and its upload to the store
FORMAT = 1


def records_key(key: str) -> str:
    """The store's job id under which the step checkpoints of ``key`` are committed."""
    return f"{key}.step"


@dataclass(frozen=True)
class StepCheckpoint:
    """A committed checkpoint of a whole step: its parts (store checkpoints under the job's key), in task
    order."""

    id: str
    parts: tuple[str, ...]
    ranks_per_node: int


def latest(store: CheckpointStore, key: str) -> StepCheckpoint | None:
    info = store.latest(records_key(key))
    if info is None:
        return None
    meta = store.reader(records_key(key), info.id).meta
    return StepCheckpoint(info.id, tuple(meta["parts"]), int(meta["ranks_per_node"]))


def commit(store: CheckpointStore, key: str, ck: str, parts: list[str], ranks_per_node: int, keep: int) -> None:
    """Commit the step checkpoint ``ck`` of ``parts``; keep the newest ``keep`` and the parts they name."""
    w = store.writer(records_key(key), ck)
    try:
        w.commit({"format": FORMAT, "parts": parts, "ranks_per_node": ranks_per_node})
    except BaseException:
        with contextlib.suppress(Exception):
            w.abort()
        raise
    store.retain(records_key(key), keep)
    named = {p for info in store.list(records_key(key))
             for p in store.reader(records_key(key), info.id).meta["parts"]}
    # Parts of older checkpoints, and of checkpoints that failed on some task (stored here, never committed).
    store.keep_only(key, named)


def delete(store: CheckpointStore, key: str) -> None:
    store.delete_job(records_key(key), collect=False)
    store.delete_job(key)


def _int(msg: dict[str, Any], name: str) -> int:
    v = msg.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValidationError(f"{name} must be a non-negative integer, not {v!r}", field=name)
    return v


def _text(msg: dict[str, Any], name: str, limit: int = 512) -> str:
    v = msg.get(name)
    if not isinstance(v, str) or not v or len(v) > limit:
        raise ValidationError(f"{name} must be a string of 1 to {limit} characters", field=name)
    return v


def _comms(raw: object) -> dict[str, tuple[int, list[int]]]:
    """A task's per-communicator counts, as it sent them: bounded and typed, else a clear error."""
    if not isinstance(raw, dict) or len(raw) > limits.MAX_COMMUNICATORS:
        raise ValidationError(f"comms must be a mapping of at most {limits.MAX_COMMUNICATORS} communicators",
                              field="comms")
    out: dict[str, tuple[int, list[int]]] = {}
    members = 0
    for key, value in raw.items():
        if not isinstance(value, list) or len(value) != 2:
            raise ValidationError(f"communicator {str(key)[:40]!r}: [count, members] expected", field="comms")
        count, ms = value
        out[_key(key)] = (_int({"count": count}, "count"), _members(ms))
        members += len(ms)
    if members > limits.MAX_CUT_MEMBERS:
        raise ValidationError(f"comms name {members} members in all, over {limits.MAX_CUT_MEMBERS}", field="comms")
    return out


def _members(raw: object) -> list[int]:
    if not isinstance(raw, list) or len(raw) > limits.MAX_CUT_MEMBERS or \
            not all(isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in raw):
        raise ValidationError("members must be a list of rank numbers", field="members")
    return raw


def _key(key: object) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= limits.MAX_COMMUNICATOR_CHARS:
        raise ValidationError(f"a communicator's name must be 1 to {limits.MAX_COMMUNICATOR_CHARS} characters",
                              field="comms")
    return key


def _plan(raw: object) -> Plan:
    """A park round's plan, as the coordinator sent it: bounded and typed, else a clear error."""
    targets = raw.get("targets") if isinstance(raw, dict) else None
    members = raw.get("members") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(targets, dict) or not isinstance(members, dict) or \
            len(targets) > limits.MAX_COMMUNICATORS or len(members) > limits.MAX_COMMUNICATORS:
        raise ValidationError("plan must hold targets and members of at most "
                              f"{limits.MAX_COMMUNICATORS} communicators", field="plan")
    ms = {_key(k): _members(v) for k, v in members.items()}
    if sum(len(v) for v in ms.values()) > limits.MAX_CUT_MEMBERS:
        raise ValidationError(f"plan names over {limits.MAX_CUT_MEMBERS} members in all", field="plan")
    return Plan({_key(k): _int({"target": v}, "target") for k, v in targets.items()}, ms, _int(raw, "version"))


def _needs(raw: object) -> list[Need]:
    if not isinstance(raw, list) or len(raw) > limits.MAX_COMMUNICATORS:
        raise ValidationError(f"needs must be a list of at most {limits.MAX_COMMUNICATORS}", field="needs")
    out = []
    for n in raw:
        if not isinstance(n, dict):
            raise ValidationError("a need must be an object", field="needs")
        out.append(Need(_text(n, "key", limits.MAX_COMMUNICATOR_CHARS), tuple(_members(n.get("members"))),
                        _int(n, "count")))
    return out


def _rendezvous(msg: dict[str, Any]) -> Store | None:
    if msg.get("store_addr") is None:
        return None
    return Store(_text(msg, "store_addr"), _text(msg, "prefix"))


class Share:
    """One task's share of a cut: the steps ordered by the coordinator, carried out on its own ranks."""

    def __init__(self, job: Job, store: CheckpointStore, key: str) -> None:
        self.job, self.store, self.key = job, store, key
        self.log_ends: dict[int, int] = {}  # after a dump: where each rank's output ends in it

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        if op == "report":
            epoch = _int(msg, "epoch")
            rep = self.job.report(epoch)
            return {"comms": {k: [c, m] for k, (c, m) in rep.comms.items()}, "default": rep.default}
        if op == "park":
            epoch = _int(msg, "epoch")
            plan = _plan(msg.get("plan"))
            needs = self.job.park(epoch, plan)
            return {"needs": [{"key": n.key, "members": list(n.members), "count": n.count} for n in needs]}
        if op == "supersede":
            epoch, version = _int(msg, "epoch"), _int(msg, "version")
            self.job.supersede(epoch, version)
            return {}
        if op == "dump":
            then = msg.get("then")
            if then not in ("continue", "hold"):
                raise ValidationError(f"then must be 'continue' or 'hold', not {then!r}", field="then")
            part = check_id("checkpoint id", _text(msg, "part", 200))
            info = self.job.checkpoint(then, checkpoint_id=part, cut_at=(_int(msg, "epoch"), _int(msg, "target")),
                                       rendezvous=_rendezvous(msg))
            ranks = self.store.reader(self.key, info.id).meta["ranks"]
            self.log_ends = {int(r): int(m["log_bytes"]) for r, m in ranks.items()}
            return {"part": info.id}
        if op == "finish":
            if msg.get("then") == "kill":
                self.job.kill()
            else:
                self.job.release(_rendezvous(msg), rebuild=bool(msg.get("rebuild")))
            return {}
        raise ValidationError(f"unknown step order {op!r}", field="op")


class _Party:
    """A task as the coordinator sees it: orders in, replies out (its own task: a direct call)."""

    def __init__(self, task: int, conn: Connection | None, share: Callable[[], Share | None]) -> None:
        self.task, self.conn, self._share = task, conn, share

    def call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.conn is not None:
            return self.conn.request(msg, timeout)
        share = self._share()
        if share is None:
            return {"error": "its ranks are not running"}
        try:
            return share.handle(msg)
        except Exception as exc:
            return {"error": getattr(exc, "message", None) or str(exc), "kind": type(exc).__name__}


class StepFailed(MechanismError):
    """A step of a cut over the step's tasks failed on some task."""



def _all(parties: list[_Party], msg: dict[str, Any] | Callable[[_Party], dict[str, Any]],
         timeout: float) -> list[dict[str, Any]]:
    """Send ``msg`` (or ``msg(task)``) to every task at once; their replies, or :class:`StepFailed` naming who
    failed and why."""
    with ThreadPoolExecutor(len(parties)) as pool:
        futures = [pool.submit(p.call, msg(p) if callable(msg) else msg, timeout) for p in parties]
        replies: list[dict[str, Any]] = []
        errors: list[str] = []
        for p, f in zip(parties, futures, strict=True):
            try:
                r = f.result()
            except TidalError as exc:
                r = {"error": exc.message}
            replies.append(r)
            if "error" in r:
                errors.append(f"task {p.task}: {r['error']}")
    if errors:
        op = (msg(parties[0]) if callable(msg) else msg).get("op")
        raise StepFailed(f"{op} failed on {'; '.join(errors)}")
    return replies


# -- the two roles -----------------------------------------------------------------------------------------
def _node_addr(node: str) -> str:
    """The address the other nodes reach ``node`` at: its ``NodeAddr`` in Slurm, else its name resolved."""
    addr = scontrol.show("node", node).get("NodeAddr")
    if addr:
        return addr
    try:
        return socket.gethostbyname(node)
    except OSError as exc:
        raise MechanismError(f"cannot find the address of node {node}: {exc}",
                             hint="Slurm's NodeAddr of the node, or its name in DNS, must give it") from None


class StepTask:
    """One task of a multi-task step; :meth:`run` returns the exit code, or None when the ranks were stopped
    (checkpointed or not) and Slurm is to start the job again."""

    def __init__(self, run: SlurmRun, site: Site) -> None:
        self.r, self.site = run, site
        self.step = run.step
        self.key = self.step.key
        self.k = run.opts.ranks_per_node
        self.job: Job | None = None
        self.share: Share | None = None
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        run_id = f"{self.step.job_id or 'run'}.{self.step.restarts}"
        self.run_id = run_id
        self.note = f"steps/{self.key}/{run_id}.json"

    # -- shared ---------------------------------------------------------------------------------------------
    def _start(self, msg: dict[str, Any]) -> Job:
        """Launch or restore this task's ranks as the coordinator said."""
        rdv = Store(_text(msg, "store_addr"), _text(msg, "prefix"))
        specs = self.r.specs(self.site.workdir, _text(msg, "master_addr"), rdv)
        placement = [(s, self.site.node) for s in specs]
        track_fs = self.step.task == 0  # the working directory is shared: one task saves and restores it
        parts = msg.get("parts")
        if parts is None:
            job = Job.launch(self.key, placement, self.site.store, track_fs=track_fs, fs_ignore=self.site.ignore)
            offsets = {s.rank: 0 for s in specs}
        else:
            if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
                raise ValidationError("parts must be a list of checkpoint ids", field="parts")
            job = Job.restore(self.site.store, self.key, placement, checkpoint_id=parts, rendezvous=rdv,
                              track_fs=track_fs, fs_ignore=self.site.ignore)
            offsets = {}
            for p in parts:
                for r, m in self.site.store.reader(self.key, p).meta["ranks"].items():
                    offsets[int(r)] = int(m["log_bytes"])
        self.job = job
        self.share = Share(job, self.site.store, self.key)
        self.r.forward(job, specs, offsets, self.site.node)
        return job

    def _exit_code(self) -> int | None:
        """This task's ranks' exit code once they have all ended, else None."""
        job = self.job
        if job is None or any(r.running for r in job.ranks):
            return None
        statuses = job.wait(30)
        bad = [s for s in statuses if not s.ok]
        if not bad:
            return 0
        return bad[0].code if bad[0].code is not None else 128 + (bad[0].signal or 0)

    def _kill(self) -> None:
        if self.job is not None:
            with contextlib.suppress(Exception):
                self.job.kill()

    def run(self) -> int | None:
        try:
            return self._coordinate() if self.step.task == 0 else self._member()
        finally:
            self.r.end_forwarding(self.share.log_ends if self.share else {})

    # -- task 0 -------------------------------------------------------------------------------------------
    def _coordinate(self) -> int | None:
        store, step = self.site.store, self.step
        addr = _node_addr(step.node)
        rdv_server = self.r.host_rendezvous()
        store_addr = self.r.rendezvous_addr = f"{addr}:{rdv_server.port}"
        secret = secrets.token_bytes(32)
        server = socket.create_server(("", 0), backlog=step.tasks * 2)
        parties: list[_Party] = [_Party(0, None, lambda: self.share)]
        try:
            store.backend.put(self.note, json.dumps({"addr": addr, "port": server.getsockname()[1],
                                                     "secret": secret.hex()}).encode())
            deadline = time.monotonic() + START_TIMEOUT_S
            conns: dict[int, Connection] = {}
            while len(conns) < step.tasks - 1:
                conn, task = accept(server, secret, max(1.0, deadline - time.monotonic()))
                if not 0 < task < step.tasks or task in conns:
                    conn.close()
                    continue
                conns[task] = conn
            for task in sorted(conns):
                parties.append(_Party(task, conns[task], lambda: None))
                threading.Thread(target=conns[task].serve, args=(self._refuse, self._event_from(task)),
                                 daemon=True, name=f"tidal-step-task-{task}").start()
            found = latest(store, self.key)
            if found is not None and (len(found.parts) != step.tasks or found.ranks_per_node != self.k):
                raise CheckpointError(
                    f"the last checkpoint {found.id} of job {self.key} was taken over {len(found.parts)} task(s) of "
                    f"{found.ranks_per_node} rank(s); this step has {step.tasks} of {self.k}", object=found.id,
                    hint=f"run the step as it was first run (srun -N {len(found.parts)} ... --ranks-per-node "
                         f"{found.ranks_per_node}); the checkpoint is kept")
            prefix = f"slurm-{self.key}/{self.run_id}"
            start = {"op": "start", "master_addr": addr, "store_addr": store_addr, "prefix": prefix,
                     "parts": list(found.parts) if found else None}
            try:
                with ThreadPoolExecutor(len(parties)) as pool:
                    futures = [pool.submit(self._start, start)] + [
                        pool.submit(p.call, start, START_TIMEOUT_S) for p in parties[1:]]
                    errors = []
                    for p, f in zip(parties, futures, strict=True):
                        try:
                            r = f.result()
                            if isinstance(r, dict) and "error" in r:
                                errors.append(f"task {p.task}: {r['error']}")
                        except TidalError as exc:
                            errors.append(f"task {p.task}: {exc.message}")
                if errors:
                    raise MechanismError(f"job {self.key} could not start on every task: {'; '.join(errors)}")
            except BaseException:
                self._kill()
                if parties[1:]:
                    with contextlib.suppress(StepFailed):
                        _all(parties[1:], {"op": "finish", "then": "kill"}, CUT_TIMEOUT_S)
                raise
            if found is not None:
                self.r.say(f"job {self.key} restored from checkpoint {found.id} on {step.tasks} nodes "
                           f"({', '.join(step.nodes)})")
            code = self._supervise_all(parties)
            for p in parties[1:]:  # what the step came to: each task ends with it
                with contextlib.suppress(TidalError):
                    p.call({"op": "bye", "code": code if code is not None else 0, "stopped": code is None},
                           CUT_TIMEOUT_S)
            if code == 0:
                delete(store, self.key)
            return code
        finally:
            server.close()
            with contextlib.suppress(Exception):
                store.backend.delete(self.note)
            for p in parties[1:]:
                if p.conn is not None:
                    p.conn.close()

    @staticmethod
    def _refuse(msg: dict[str, Any]) -> dict[str, Any]:
        return {"error": f"the coordinator takes no order {msg.get('op')!r}"}

    def _event_from(self, task: int) -> Callable[[dict[str, Any]], None]:
        return lambda msg: self.events.put((task, msg))

    def _supervise_all(self, parties: list[_Party]) -> int | None:
        every = self.r.opts.checkpoint_every
        next_at = time.monotonic() + every if every else None
        ended: dict[int, int] = {}
        while True:
            try:
                task, ev = self.events.get(timeout=0.1)
            except queue.Empty:
                task, ev = -1, {}
            if "closed" in ev and task not in ended:
                self.r.say(f"lost task {task} of job {self.key}: {ev['closed']}; stopping the job")
                self._stop_all(parties, [task])
                return 1
            if ev.get("event") == "stop" and self.r.stop_signal is None:
                self.r.stop_signal = str(ev.get("signal", "SIGTERM"))[:16]
                self.r.wake.set()
            self._note_end(ended, task, ev)
            bad = {t: c for t, c in ended.items() if c != 0}
            if bad:
                t, c = min(bad.items())
                self.r.say(f"the ranks of task {t} of job {self.key} ended with exit code {c}; stopping the others")
                self._stop_all(parties, list(ended))
                return c
            if len(ended) == len(parties):
                return 0
            if self.r.wake.is_set():
                if ended:  # ending: the others follow
                    try:
                        wait_until(lambda: self._all_ended(parties, ended), timeout=10, what="the job's ranks to end")
                        return max(ended.values())
                    except TidalError:
                        self._stop_all(parties, list(ended))
                        self.r.say(f"{self.r.stop_signal}: some ranks of job {self.key} ended during its checkpoint; "
                                   "the job is stopped")
                        return 1
                with contextlib.suppress(TidalError):  # failed: said so, and the ranks are killed all the same
                    self._checkpoint(parties, stop=True)
                return None
            if next_at is not None and time.monotonic() >= next_at:
                with contextlib.suppress(TidalError):
                    self._checkpoint(parties, stop=False)
                next_at = time.monotonic() + (every or 0)

    def _note_end(self, ended: dict[int, int], task: int, ev: dict[str, Any]) -> None:
        """Record in ``ended`` (task → exit code) a task's report that its ranks ended, and this task's own."""
        if ev.get("event") == "exited":
            ended[task] = ev["code"] if isinstance(ev.get("code"), int) else 1
        if 0 not in ended:
            code = self._exit_code()
            if code is not None:
                ended[0] = code

    def _all_ended(self, parties: list[_Party], ended: dict[int, int]) -> bool:
        while True:
            try:
                task, ev = self.events.get_nowait()
            except queue.Empty:
                task, ev = -1, {}
            self._note_end(ended, task, ev)
            if task < 0:
                return len(ended) == len(parties)

    def _stop_all(self, parties: list[_Party], skip: list[int]) -> None:
        live = [p for p in parties if p.task not in skip and (p.conn is None or not p.conn.closed.is_set())]
        with contextlib.suppress(StepFailed):
            if live:
                _all(live, {"op": "finish", "then": "kill"}, CUT_TIMEOUT_S)
        self._kill()

    def _checkpoint(self, parties: list[_Party], *, stop: bool) -> None:
        """A checkpoint over every task (see the module's doc). ``stop``: the ranks are killed after it,
        whether it was committed or not."""
        store, why = self.site.store, self.r.stop_signal
        seq = 1 + max((sequence_of(i.id) for i in store.list(records_key(self.key))), default=0)
        ck = new_checkpoint_id(seq)
        epoch = new_epoch()
        rdv: Store | None = None
        phase = "counts"
        try:
            replies = _all(parties, {"op": "report", "epoch": epoch}, CUT_TIMEOUT_S)
            plan = Plan.from_counts(_comms(r.get("comms")) for r in replies)
            default = next((str(r["default"]) for r in replies if isinstance(r.get("default"), str)), None)
            phase = "park"
            self._park(parties, epoch, plan)
            target = plan.target(default)
            phase = "dump"
            rdv = Store(self.r.rendezvous_addr, f"slurm-{self.key}/{self.run_id}/{ck}")
            then = "hold" if stop else "continue"
            replies = _all(parties, lambda p: {"op": "dump", "epoch": epoch, "target": target, "then": then,
                                               "part": f"{ck}.p{p.task}", "store_addr": rdv.addr,
                                               "prefix": rdv.prefix}, DUMP_TIMEOUT_S)
            parts = [str(r["part"]) for r in replies]
            commit(store, self.key, ck, parts, self.k, self.r.opts.keep)
        except TidalError as exc:
            rebuild = phase == "dump"
            finish = {"op": "finish", "then": "kill" if stop else "resume", "rebuild": rebuild,
                      **({"store_addr": rdv.addr, "prefix": rdv.prefix} if rebuild and rdv else {})}
            with contextlib.suppress(StepFailed):
                _all(parties, finish, CUT_TIMEOUT_S)
            if stop:
                self._kill()
                last = latest(store, self.key)
                since = f"its last checkpoint {last.id}" if last else "its start"
                self.r.say(f"{why}: checkpoint of job {self.key} failed: {exc.message}; when Slurm starts it again "
                           f"it goes on from {since}, nothing committed is lost")
            else:
                self.r.say(f"periodic checkpoint of job {self.key} failed: {exc.message} (the job goes on)")
            raise
        then = "kill" if stop else "resume"
        _all(parties, {"op": "finish", "then": then, "rebuild": True, "store_addr": rdv.addr, "prefix": rdv.prefix},
             CUT_TIMEOUT_S)
        if stop:
            self.r.say(f"{why}: checkpoint {ck} of job {self.key} committed ({len(parties)} tasks); it goes on from "
                       "there when Slurm starts it again")
        else:
            self.r.say(f"periodic checkpoint {ck} of job {self.key} committed")

    @staticmethod
    def _park(parties: list[_Party], epoch: int, plan: Plan) -> None:
        """Park rounds on every task at once until none raises the plan's targets. The first task that
        answers with needs raises them, and the round still running on the others gives way to the next: their
        ranks may be waiting for the ranks that need more (docs/distributed.md, over several nodes)."""
        for _ in range(limits.MAX_COMMUNICATORS * 4):
            msg = {"op": "park", "epoch": epoch, "plan": plan.message()}
            needs: list[Need] = []
            with ThreadPoolExecutor(len(parties)) as pool:
                futures = {pool.submit(p.call, msg, CUT_TIMEOUT_S): p for p in parties}
                errors = []
                for done in as_completed(futures):
                    try:
                        r = done.result()
                        if "error" in r:
                            errors.append(f"task {futures[done].task}: {r['error']}")
                            continue
                        got = _needs(r.get("needs") or [])
                    except TidalError as exc:
                        errors.append(f"task {futures[done].task}: {exc.message}")
                        continue
                    if got and not needs:
                        needs = got
                        if not plan.raise_for(needs):
                            plan.version += 1  # covered already: a new version their ranks reach
                        for p in parties:
                            with contextlib.suppress(TidalError):
                                p.call({"op": "supersede", "epoch": epoch, "version": plan.version},
                                       CUT_TIMEOUT_S)
            if errors:
                raise StepFailed(f"park failed on {'; '.join(errors)}")
            if not needs:
                return
        raise StepFailed("park: the targets kept rising; the cut is given up")

    # -- the other tasks ----------------------------------------------------------------------------------
    def _member(self) -> int | None:
        store, step = self.site.store, self.step
        where: dict[str, Any] = {}

        def published() -> bool:
            with contextlib.suppress(FileNotFoundError, ValueError, TidalError):
                where.update(json.loads(store.backend.get(self.note)))
                return True
            return False

        wait_until(published, timeout=START_TIMEOUT_S, what=f"the coordinator of job {self.key} (task 0, on "
                   f"{step.coordinator}) to start", interval=0.2)
        try:
            secret = bytes.fromhex(str(where["secret"]))
            conn = connect(str(where["addr"]), int(where["port"]), secret, step.task, START_TIMEOUT_S)
        except (KeyError, ValueError, TypeError) as exc:
            raise MechanismError(f"the coordinator's record {self.note} in the store is damaged: {exc}") from None
        bye: dict[str, int] = {}
        lost = threading.Event()
        started = threading.Event()

        def on_request(msg: dict[str, Any]) -> dict[str, Any]:
            op = msg.get("op")
            if op == "start":
                try:
                    self._start(msg)
                finally:
                    started.set()
                return {"ok": True}
            if op == "bye":
                bye["stopped"] = int(msg.get("stopped") is True)
                bye["code"] = _int(msg, "code")
                return {}
            share = self.share
            if share is None:
                raise MechanismError(f"the ranks of task {step.task} are not running")
            return share.handle(msg)

        def on_event(msg: dict[str, Any]) -> None:
            if "closed" in msg:
                lost.set()

        threading.Thread(target=conn.serve, args=(on_request, on_event), daemon=True, name="tidal-step").start()
        told: str | None = None
        reported = False
        try:
            while "code" not in bye:
                if lost.is_set():
                    if "code" in bye:
                        break
                    self._kill()
                    self.r.say(f"lost the coordinator of job {self.key} (task 0 on {step.coordinator}); the ranks "
                               f"here are stopped")
                    return 1
                if self.r.stop_signal is not None and told != self.r.stop_signal:
                    told = self.r.stop_signal
                    with contextlib.suppress(ChannelClosed):
                        conn.send({"event": "stop", "signal": told})
                if started.is_set() and not reported:
                    code = self._exit_code()
                    if code is not None:
                        reported = True
                        with contextlib.suppress(ChannelClosed):
                            conn.send({"event": "exited", "code": code})
                self.r.wake.wait(0.1)
                self.r.wake.clear()
            if bye["stopped"]:
                return None
            return self._exit_code() or bye["code"]
        finally:
            conn.close()
