"""Runs the control plane's actions with the checkpoint mechanism, and reports what happens.

Every action is read with the protocol (:func:`tidal.core.protocol.decode_action`); one this agent cannot
read (another protocol version, an order of an unknown kind, a bad field) is not run, and is reported as
failed with the reason. Each kind of order has its handler (:attr:`Executor.handlers`), which takes the
typed order and returns its typed result. Actions of one job run one after another in arrival order (a
kill after a restore finds the restored ranks), except prestages, which run beside them in a queue of their
own (a migration's target fetches while the job's other orders go on; :mod:`~tidal.agent.prestaging`). An
action id seen before is never run twice: its result is sent again instead. The ranks' exits are reported
unless the agent itself stopped them (checkpoint-and-kill, kill). Log bytes are shipped from the start of each
attempt, so that a restore, whose log starts as the checkpoint's copy, rolls the served log back with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.agent.client import ControlClient, Refused
from tidal.agent.devices import CpuQuota
from tidal.agent.gpus import Gpu, Nvml, process_memory, rank_env
from tidal.agent.prestaging import Prestages
from tidal.config import load_settings
from tidal.core import protocol
from tidal.core.cutplan import Need, Plan
from tidal.core.rankenv import torchrun_env
from tidal.errors import CheckpointCorrupt, Conflict, LeaseLost, ProtocolMismatch, StoreUnreachable, ValidationError
from tidal.mechanisms.accounts import Account
from tidal.mechanisms.criu import tasks
from tidal.mechanisms.criu.job import Job, LocalDump
from tidal.mechanisms.criu.lastdump import LastDump
from tidal.mechanisms.criu.rank import NodeRoot, RankProcess, RankSpec
from tidal.mechanisms.interpose.channel import Store
from tidal.mechanisms.storage import CheckpointStore, store_options
from tidal.mechanisms.storage.replicate import Replicated, replicate

log = logging.getLogger(__name__)
CHUNK = 4 << 20
MIB = 1 << 20
RESULTS_KEPT = 4096  # results of actions done, remembered to answer one delivered again


def as_account(unix_user: str | None) -> Account | None:
    """The account a job's command runs as: its owner's, so that a job reads only what its owner may read.
    The rank's init stays root (CRIU needs it) and drops to it before running anything of the job's."""
    if not unix_user:
        return None
    acct = Account.named(unix_user)
    return None if acct.uid == os.getuid() else acct


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gpu_rank_bytes(rank_pids: list[list[int]], memory: dict[int, int | None]) -> int | None:
    """The most GPU memory one rank holds (its processes' sum), from :func:`process_memory`'s reading; None
    when it cannot be told: none of the ranks' processes is listed (the job has not touched a GPU yet, or
    NVML could not be read), or the driver does not say how much one holds. A rank NVML does not list holds
    none."""
    if not any(p in memory for ps in rank_pids for p in ps):
        return None
    sums = []
    for ps in rank_pids:
        used = [memory.get(p, 0) for p in ps]
        if None in used:
            return None
        sums.append(sum(u for u in used if u is not None))
    return max(sums)


class Watchdog:
    """Notices a rank whose command has ended while its init did not report it (the job would stay running,
    holding its devices, with nothing left to run): after ``nudge_after`` seconds it wakes the init, as the
    command's end should have; after ``kill_after`` it kills the rank, whose end is then reported."""

    def __init__(self, every: float = 1.0, nudge_after: float = 2.0, kill_after: float = 6.0) -> None:
        self.every, self.nudge_after, self.kill_after = every, nudge_after, kill_after
        self.last = time.monotonic()
        self.since: dict[int, float] = {}

    def check(self, ranks: list[RankProcess]) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        for rp in ranks:
            if not rp.command_gone():
                self.since.pop(rp.spec.rank, None)
                continue
            first = self.since.setdefault(rp.spec.rank, now)
            if now - first >= self.kill_after:
                log.error("rank %s: its command ended %.0fs ago and its init did not report it; killing the rank",
                          rp.spec.name, now - first)
                with contextlib.suppress(Exception):
                    rp.kill(wait=False)
            elif now - first >= self.nudge_after:
                log.warning("rank %s: its command ended and its init has not reported it; waking the init",
                            rp.spec.name)
                rp.nudge()


@dataclass
class Running:
    job_id: str
    attempt: int
    job: Job
    specs: list[RankSpec]
    stopping: bool = False  # the agent is stopping it: its exit is not news
    quiet_exit: list[protocol.RankExit] | None = None
    shipped: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: set[int] = field(default_factory=set)  # ranks the agent killed because another one failed
    rate: tuple[float, int, int] | None = None  # (time, steps, collectives) at the previous progress report


def _status(rp: RankProcess, stopped: set[int]) -> protocol.RankExit:
    st = rp.poll()
    assert st is not None
    return protocol.RankExit(rank=rp.spec.rank, code=st.code, signal=st.signal, at=rp.exit_time,
                             stopped=rp.spec.rank in stopped)


def _failed(st: protocol.RankExit) -> bool:
    return not st.stopped and (st.signal is not None or st.code != 0)


def failure(exc: BaseException) -> protocol.Failure:
    """What a failed action's result carries besides its message: a checkpoint that failed verification
    (the control plane marks it bad and restores an older one instead of trying it again), or a store a
    restore had to copy its checkpoint from that did not answer (the control plane restores an older one held
    elsewhere)."""
    if isinstance(exc, StoreUnreachable):
        return protocol.Failure(unreachable=protocol.Unreachable(store=str(exc.fields.get("store") or "")[:4096],
                                                                 message=exc.message[:4000]))
    if not isinstance(exc, CheckpointCorrupt):
        return protocol.Failure()
    f = exc.fields
    try:
        corrupt = protocol.decode(protocol.Corruption, {
            "checkpoint": f.get("checkpoint"), "object": f.get("object"), "chunk": f.get("chunk"),
            "reason": f.get("reason"), "message": exc.message})
    except ValidationError:  # a part the protocol cannot carry: the message still says what is damaged
        corrupt = protocol.Corruption(message=exc.message)
    return protocol.Failure(corrupt=corrupt)


def failed(agent_id: str, action_id: str, error: str, why: protocol.Failure | None = None) -> protocol.ActionResult:
    """A failed action's result."""
    return protocol.ActionResult(agent_id=agent_id, action_id=action_id, ok=False, error=error,
                                 data=protocol.encode(why or protocol.Failure()))


def _store(rdv: protocol.Rendezvous | None) -> Store | None:
    return Store(rdv.addr, rdv.prefix) if rdv else None


Report = protocol.ActionResult | protocol.ExitReport | protocol.CommitReport


class Outbox:
    """Results and exit reports, delivered in order, retried until the control plane has them. Each goes
    under the agent's id at the time it is sent (a new one once the lease was lost and taken again);
    ``on_lease_lost`` is told the id the control plane refused."""

    def __init__(self, client: ControlClient, agent_id: str, on_lease_lost: Callable[[str], None]) -> None:
        self.client = client
        self.agent_id = agent_id
        self.q: queue.Queue[tuple[str, Report]] = queue.Queue()
        self.on_lease_lost = on_lease_lost
        threading.Thread(target=self._run, name="tidal-outbox", daemon=True).start()

    def put(self, path: str, msg: Report) -> None:
        self.q.put((path, msg))

    def _run(self) -> None:
        while True:
            path, msg = self.q.get()
            self._deliver(path, msg.model_copy(update={"agent_id": self.agent_id}))

    def _deliver(self, path: str, msg: Report) -> None:
        try:
            self.client.send(f"/v1/agent/{self.client.node}/{path}", msg)
        except LeaseLost:
            self.on_lease_lost(msg.agent_id)
        except ProtocolMismatch as exc:
            log.error("report %s dropped: %s", path, exc)
        except Refused as exc:
            if isinstance(msg, protocol.ActionResult) and msg.ok and exc.fields.get("status") == 422:
                # The control plane cannot take this result: the action failed, so that it is not awaited
                # for ever; the reason says what was wrong with it.
                log.error("result of action %s refused: %s; reporting the action failed", msg.action_id, exc)
                self._deliver(path, failed(msg.agent_id, msg.action_id,
                                           f"the control plane refused the agent's result: {exc.message}"))
                return
            log.error("report %s dropped: %s", path, exc)
        except Exception:
            log.exception("report %s dropped", path)


class Executor:
    """Runs the actions of the lease this agent holds.

    An action belongs to the lease (the agent id) it was fetched under, and runs only while the agent
    still holds that lease: once :meth:`fence` ends it, actions of that lease still queued are dropped,
    and ranks that a launch or restore under way starts are killed at once, until :meth:`hold` names the
    agent's next lease."""

    def __init__(self, client: ControlClient, node: NodeRoot, store: CheckpointStore, agent_id: str,
                 on_lease_lost: Callable[[str], None], quota: CpuQuota | None = None,
                 gpus: Sequence[Gpu] = ()) -> None:
        self.client = client
        self.quota = quota
        self.gpus = tuple(gpus)  # device index → its GPU, on a node of GPU devices (empty: CPU devices)
        self.nvml: Nvml | None = None  # where the ranks' GPU memory is read (None: the real NVML)
        self.node = node
        self.store = store
        self.agent_id = agent_id
        self.lease: str | None = agent_id  # the lease actions run for; None once fenced, until held again
        self._acting = threading.local()  # the lease of the action this (job's) thread runs
        self.outbox = Outbox(client, agent_id, on_lease_lost)
        self.jobs: dict[str, Running] = {}
        # Action id → its result, to answer an action delivered again (idempotency): the newest RESULTS_KEPT,
        # since the control plane sends an action again only until it has its result.
        self.results: dict[str, protocol.ActionResult] = {}
        self.inflight: set[str] = set()
        self.queues: dict[str, list[tuple[str, protocol.Action]]] = {}  # job → (lease, action), in order
        self.ended: dict[str, tuple[int, list[protocol.RankExit]]] = {}  # job → (attempt, how its ranks ended)
        self.cut_timeout = load_settings().cut_timeout
        self.mu = threading.Lock()
        # What runs each kind of order: its handler takes the typed order and returns the typed result.
        self.handlers: dict[type[protocol.Message], Callable[[Any], protocol.Result]] = {
            protocol.Launch: self._launch, protocol.Restore: self._restore, protocol.CutCounts: self._cut,
            protocol.Park: self._park, protocol.Checkpoint: self._checkpoint, protocol.Finish: self._finish,
            protocol.Kill: self._kill, protocol.Prestage: self._prestage, protocol.Unstage: self._unstage,
        }
        self.prestages = Prestages()
        # Job → its dump answered before its commit ended (Checkpoint ``commit_after``), for its restore here.
        self.local_dumps: dict[str, LocalDump] = {}
        self._answered: dict[str, threading.Event] = {}  # action → set once its result is in the outbox
        self._source_stores: dict[str, CheckpointStore] = {}  # other regions' stores, opened to replicate from
        # Job → (attempt, bytes copied, bytes to copy) of a replication under way: reported with the progress.
        self._copying: dict[str, tuple[int, int, int]] = {}

    # -- actions --------------------------------------------------------------------------------------------
    def submit(self, data: Any, lease: str | None = None) -> None:
        """Take an action as it came from the control plane, to run in its job's turn. ``lease``: the agent
        id it was fetched under (default: the lease held now)."""
        try:
            action = protocol.decode_action(data)
        except ValidationError as exc:  # a ProtocolMismatch too
            self._refuse(data, exc)
            return
        with self.mu:
            lease = lease or self.lease
            if lease is None or lease != self.lease:
                log.info("action %s (%s of job %s) dropped: it came under a lease this agent no longer holds",
                         action.id, action.kind, action.job_id)
                return
            if self._seen(action.id):
                return
            self.inflight.add(action.id)
            if isinstance(action.order, protocol.Prestage):  # before any later restore can look for it
                self.prestages.expect(action.job_id, action.order.attempt, action.order.checkpoint.id)
            if isinstance(action.order, protocol.Park) and action.order.targets is not None:
                # A newer park round: the one running for the job (its queue's head) gives way to it now,
                # rather than wait for ranks that may be waiting for the raised targets.
                run = self.jobs.get(action.job_id)
                if run is not None:
                    run.job.supersede(action.order.epoch, action.order.version)
            key = _queue_of(action)
            q = self.queues.setdefault(key, [])
            q.append((lease, action))
            if len(q) == 1:
                threading.Thread(target=self._drain, args=(key,), daemon=True, name=f"tidal-job-{key}").start()

    def _seen(self, action_id: str) -> bool:
        """Whether the action came before (its result, if there is one yet, is sent again). Under ``mu``."""
        if action_id in self.results:
            self.outbox.put("results", self.results[action_id])
            return True
        return action_id in self.inflight

    def _refuse(self, data: Any, exc: ValidationError) -> None:
        """An action this agent cannot read is not run. If its id can be read, it is reported as failed
        with the reason, so that the control plane learns it; else the reason is only logged here."""
        action_id = data.get("id") if isinstance(data, dict) else None
        try:
            res = protocol.decode(protocol.ActionResult, {
                "agent_id": self.agent_id, "action_id": action_id, "ok": False,
                "error": f"the agent on {self.client.node} did not run it: {exc}",
                "data": protocol.encode(protocol.Failure())})
        except ValidationError:
            log.error("an action with no readable id was not run: %s", exc)
            return
        log.error("action %s was not run: %s", action_id, exc)
        with self.mu:
            if self._seen(res.action_id):
                return
            self._keep(res)
        self.outbox.put("results", res)

    def _keep(self, res: protocol.ActionResult) -> None:
        """Remember ``res``, forgetting the oldest result beyond RESULTS_KEPT. Under ``mu``."""
        self.results[res.action_id] = res
        if len(self.results) > RESULTS_KEPT:
            del self.results[next(iter(self.results))]

    def _drain(self, key: str) -> None:
        while True:
            with self.mu:
                q = self.queues[key]
                if not q:
                    del self.queues[key]
                    return
                lease, action = q[0]
            self._run(action, lease)
            with self.mu:
                q.pop(0)

    def _run(self, action: protocol.Action, lease: str) -> None:
        with self.mu:
            if lease != self.lease:  # fenced since it came: the control plane will not await its result
                self.inflight.discard(action.id)
                log.info("action %s (%s of job %s) dropped: the lease it came under is over", action.id,
                         action.kind, action.job_id)
                return
        self._acting.lease = lease
        self._acting.action = action.id
        handler = self.handlers[type(action.order)]
        try:
            res = protocol.ActionResult(agent_id=self.agent_id, action_id=action.id, ok=True,
                                        data=protocol.encode(handler(action.order)))
        except Exception as exc:
            log.warning("action %s (%s of job %s) failed: %s", action.id, action.kind, action.job_id, exc)
            res = failed(self.agent_id, action.id, str(exc), failure(exc))
        with self.mu:
            self._keep(res)
            self.inflight.discard(action.id)
            answered = self._answered.pop(action.id, None)
        self.outbox.put("results", res)
        if answered is not None:
            answered.set()

    def _specs(self, order: protocol.Launch | protocol.Restore) -> list[RankSpec]:
        out = []
        account = as_account(order.unix_user)
        # torchrun's environment: scripts written for torchrun run unchanged.
        # (The interposer rendezvous on TIDAL_STORE, hosted by Tidal; MASTER_* only for scripts that read it.)
        port = 20000 + zlib.crc32(order.job_id.encode()) % 20000
        rdv = order.rendezvous
        for r in order.ranks:
            env = {**order.env, "TIDAL_JOB_ID": order.job_id, "TIDAL_NODE": self.client.node}
            if order.torchrun:  # else: a job submitted without ranks sees what plain `python` would
                env |= torchrun_env(
                    rank=r.rank, local_rank=r.local_rank, world_size=order.world_size,
                    local_world_size=order.local_world_size, group_rank=order.group_rank,
                    group_world_size=order.group_world_size, master_addr=order.master_addr or "127.0.0.1",
                    master_port=port, run_id=order.job_id, user_env=order.env)
            if rdv:
                env |= {"TIDAL_STORE": rdv.addr, "TIDAL_STORE_PREFIX": rdv.prefix}
            env |= rank_env(r.device, self.gpus)  # its GPU, over any the submitter's environment named
            out.append(RankSpec(order.job_id, r.rank, tuple(order.argv), Path(order.workdir), env,
                                tuple(r.cpus) if r.cpus else None, account=account))
        return out

    def _launch(self, order: protocol.Launch) -> protocol.Started:
        return self._start(order, lambda placement: Job.launch(order.job_id, placement, self.store,
                                                               track_fs=order.fs))

    def _restore(self, order: protocol.Restore) -> protocol.Started:
        copied: list[Replicated] = []

        def restore(placement: list[tuple[RankSpec, NodeRoot]]) -> Job:
            # A prestage under way is waited for first: its pre-copy leaves this replication only the chunks
            # the migration's own checkpoint changed.
            with self.mu:
                local = self.local_dumps.pop(order.job_id, None)
            if local is not None:
                if (local.id == order.checkpoint.id and order.checkpoint.source is None
                        and sorted(r.rank for r in order.ranks) == sorted(local.images)):
                    job = Job.restore(self.store, order.job_id, placement, local=local,
                                      rendezvous=_store(order.rendezvous), track_fs=order.fs)
                    log.info("job %s restored from the images of checkpoint %s dumped here (its commit goes on "
                             "meanwhile)", order.job_id, local.id)
                    return job
                _close_later(local)  # not this restore's: its images go once its commit has ended
            staged = self.prestages.take(order.job_id, order.attempt, [r.rank for r in order.ranks])
            if order.checkpoint.source is not None:
                copied.extend(self._replicate(order.job_id, order.attempt, order.checkpoint))
            job = Job.restore(self.store, order.job_id, placement, checkpoint_id=order.checkpoint.parts,
                              prestaged=staged[1] if staged else None, rendezvous=_store(order.rendezvous),
                              track_fs=order.fs)
            t = job.restore_timing
            if t is not None:
                log.info("job %s restored from checkpoint %s: fetched %.1f MiB of %.1f MiB of images from the store"
                         " in %.2fs (%s); %.2fs in all", order.job_id, order.checkpoint.id, t.fetched_bytes / MIB,
                         t.image_bytes / MIB, t.fetch_s,
                         f"prestaged from checkpoint {staged[0]}" if staged else "nothing prestaged", t.total_s)
            return job

        started = self._start(order, restore)
        if not copied:
            return started
        return started.model_copy(update={"replicated_bytes": sum(r.copied_bytes for r in copied),
                                          "replicated_chunks": sum(r.copied_chunks for r in copied),
                                          "replicated_s": round(sum(r.seconds for r in copied), 3)})

    def _replicate(self, job_id: str, attempt: int, checkpoint: protocol.CheckpointRef) -> list[Replicated]:
        """Copy the checkpoint's parts from the other region's store into this node's, only the chunks it
        lacks (what an earlier replication of the job's checkpoints brought is not copied again). Its
        progress goes out with the node's next reports (``tidal show``: what is left to copy)."""
        url = checkpoint.source
        assert url is not None
        source = self._source_stores.get(url)
        if source is None:
            settings = load_settings()
            source = CheckpointStore(url, workers=settings.store_concurrency, **store_options(settings, url))
            self._source_stores[url] = source
        out = []
        try:
            for part in checkpoint.parts:
                last = [0.0]

                def progress(done: int, total: int, part: str = part, last: list[float] = last) -> None:
                    with self.mu:
                        self._copying[job_id] = (attempt, done, total)
                    if time.monotonic() - last[0] >= 2 or done == total:
                        last[0] = time.monotonic()
                        log.info("job %s: replicating checkpoint %s from %s: %.1f of %.1f MiB copied",
                                 job_id, part, url, done / MIB, total / MIB)

                r = replicate(source, self.store, job_id, part, progress)
                log.info("job %s: checkpoint %s replicated from %s: %d of %d chunks copied (%.1f MiB stored) in "
                         "%.2fs", job_id, part, url, r.copied_chunks, r.chunks, r.copied_bytes / MIB, r.seconds)
                out.append(r)
        finally:
            with self.mu:
                self._copying.pop(job_id, None)
        return out

    def _prestage(self, order: protocol.Prestage) -> protocol.Prestaged:
        """Fetch the images of the order's ranks from its checkpoint, for the restore of the next attempt
        here. Not for a job that already runs here in a later attempt (the restore came first)."""
        run = self.jobs.get(order.job_id)
        if run is not None and run.attempt > order.attempt:
            self.prestages.drop(order.job_id, order.attempt)
            raise Conflict(f"job {order.job_id} already runs on {self.client.node} (attempt {run.attempt}): "
                           "nothing to prestage", job=order.job_id, node=self.client.node,
                           hint="the restore came first; it fetched what it needed")
        t0 = time.monotonic()
        sizes: dict[int, int] = {}

        copied: list[Replicated] = []

        def fetch() -> dict[int, LastDump]:
            if order.checkpoint.source is not None:  # pre-copy into this region's store
                copied.extend(self._replicate(order.job_id, order.attempt, order.checkpoint))
            staged = Job.prestage(self.store, order.job_id, [(r, self.node) for r in order.ranks],
                                  checkpoint_id=order.checkpoint.parts)
            sizes.update({r: last.nbytes for r, last in staged.items()})  # before a restore may take them
            return staged

        self.prestages.fetch(order.job_id, order.attempt, order.checkpoint.id, fetch)
        took = time.monotonic() - t0
        nbytes = sum(sizes.values())
        log.info("job %s: prestaged %.1f MiB of checkpoint %s (ranks %s) in %.2fs", order.job_id, nbytes / MIB,
                 order.checkpoint.id, sorted(sizes), took)
        return protocol.Prestaged(checkpoint=order.checkpoint.id, ranks=sorted(sizes), bytes=nbytes,
                                  seconds=round(took, 3),
                                  replicated_bytes=sum(r.copied_bytes for r in copied) if copied else None,
                                  replicated_chunks=sum(r.copied_chunks for r in copied) if copied else None,
                                  replicated_s=round(sum(r.seconds for r in copied), 3) if copied else None)

    def _unstage(self, order: protocol.Unstage) -> protocol.Done:
        if self.prestages.drop(order.job_id, order.attempt):
            log.info("job %s: prestaged images dropped (the control plane restores it elsewhere)", order.job_id)
        return protocol.Done()

    def _start(self, order: protocol.Launch | protocol.Restore,
               make: Callable[[list[tuple[RankSpec, NodeRoot]]], Job]) -> protocol.Started:
        """Start the order's ranks here with ``make`` (once: the same attempt started again is answered with
        its ranks), watch them, and say what their processes are."""
        run = self.jobs.get(order.job_id)
        if run is not None and run.attempt == order.attempt:
            return _pids(run.job)
        if run is not None:  # an older attempt still here: it must not run beside the new one
            self._stop(run)
        specs = self._specs(order)
        job = make([(spec, self.node) for spec in specs])
        job.cut_timeout = self.cut_timeout
        if self.quota is not None:
            device = {r.rank: r.device for r in order.ranks}
            for rp in job.ranks:
                self.quota.place(device[rp.spec.rank], rp)
        run = Running(order.job_id, order.attempt, job, specs)
        lease = getattr(self._acting, "lease", None)
        with self.mu:  # with fence(): either it sees this run and kills it, or this sees the fence
            current = lease is not None and lease == self.lease
            if current:
                self.jobs[run.job_id] = run
        if not current:
            job.kill()
            raise Conflict(f"job {order.job_id}'s ranks on {self.client.node} were killed as they started: the "
                           "agent fenced them meanwhile (its lease is over)", job=order.job_id,
                           node=self.client.node, hint="the control plane requeues the job")
        threading.Thread(target=self._watch, args=(run,), daemon=True,
                         name=f"tidal-watch-{run.job_id}").start()
        return _pids(job)

    def _run_of(self, order: protocol.CutCounts | protocol.Park | protocol.Checkpoint | protocol.Finish) -> Running:
        run = self.jobs.get(order.job_id)
        if run is None or run.attempt != order.attempt:
            raise Conflict(f"job {order.job_id} attempt {order.attempt} does not run on {self.client.node}",
                           job=order.job_id, node=self.client.node,
                           hint="its ranks here have ended (their exit report settles the job) or were never "
                                "started here; resume the job if it still shows as running")
        return run

    def _unstop(self, run: Running) -> None:
        """The agent no longer stops the job: if a rank ended meanwhile, that is news after all."""
        with run.lock:
            run.stopping = False
            quiet = run.quiet_exit
        if quiet is not None:
            with contextlib.suppress(Exception):
                self._ship(run)
            self._report_exit(run, quiet)
            self._forget(run)

    def _checkpoint(self, order: protocol.Checkpoint) -> protocol.Dumped:
        run = self._run_of(order)
        if order.then != "continue":
            run.stopping = True
        if order.commit_after and order.then == "kill" and order.cut is None:
            return self._dump_then_commit(run, order)
        # Ranks restored here next (a resize, a move within this node) start from the images dumped here.
        keep = order.restore_here and order.then == "kill"
        try:
            info = run.job.checkpoint(order.then, checkpoint_id=order.checkpoint_id,
                                      cut_at=(order.cut.epoch, order.cut.target) if order.cut else None,
                                      rendezvous=_store(order.rendezvous), keep_images=keep, warm=order.warm)
        except BaseException:
            self._unstop(run)
            raise
        t = run.job.last_timing
        if t is not None:  # where the time went, for whoever tunes a site
            log.info("job %s: checkpoint %s: ranks held %.3f s (dump %.3f s, files %.3f s), commit %.3f s, in all "
                     "%.3f s", order.job_id, info.id, t.pause_s, t.dump_s, t.fs_s, t.commit_s, t.total_s)
        if keep:
            self.prestages.put(order.job_id, order.attempt, info.id, run.job.take_images())
        if order.then == "kill":
            self._ship(run)
            self._forget(run)
        # Retention by the control plane's list: parts of the newest committed checkpoints, and those of the
        # checkpoint being written on the job's other nodes.
        self.store.keep_only(order.job_id, set(order.keep_ids) | {info.id})
        return protocol.Dumped(checkpoint=protocol.StoredCheckpoint(
            id=info.id, created_at=info.created_at, bytes=info.logical_bytes, stored_bytes=info.stored_bytes))

    def _dump_then_commit(self, run: Running, order: protocol.Checkpoint) -> protocol.Dumped:
        """Every rank of the job is restored here next: answer once the ranks are dumped and killed, keep the
        dump for that restore, and report the end of its commit, which goes on meanwhile, after this answer
        (the control plane knows the checkpoint only from the answer)."""
        answered = threading.Event()
        with self.mu:
            self._answered[self._acting.action] = answered

        def committed(dump: LocalDump) -> None:
            if dump.info is not None:
                self.store.keep_only(order.job_id, set(order.keep_ids) | {dump.id})
            if not answered.wait(600):
                log.warning("job %s: checkpoint %s's answer was not sent; its commit is not reported",
                            order.job_id, dump.id)
                return
            info = dump.info
            self.outbox.put("commits", protocol.CommitReport(
                agent_id=self.agent_id, job_id=order.job_id, attempt=order.attempt, checkpoint_id=dump.id,
                ok=info is not None, bytes=info.logical_bytes if info else 0,
                stored_bytes=info.stored_bytes if info else 0,
                error=None if info is not None else str(dump.error)[:4000]))

        try:
            dump = run.job.checkpoint_local(checkpoint_id=order.checkpoint_id, on_commit=committed)
        except BaseException:
            with self.mu:
                self._answered.pop(self._acting.action, None)
            self._unstop(run)
            raise
        self._ship(run)
        self._forget(run)
        with self.mu:
            old, self.local_dumps[order.job_id] = self.local_dumps.get(order.job_id), dump
        if old is not None:
            _close_later(old)
        return protocol.Dumped(checkpoint=protocol.StoredCheckpoint(
            id=dump.id, created_at=dump.created_at, bytes=dump.nbytes, stored_bytes=0), committing=True)

    def _cut(self, order: protocol.CutCounts) -> protocol.Counted:
        got = self._run_of(order).job.report(order.epoch)
        return protocol.Counted(counts=got.counts, default=got.default, comms={
            k: protocol.Comm(count=n, members=m) for k, (n, m) in got.comms.items()})

    def _park(self, order: protocol.Park) -> protocol.Parked:
        job = self._run_of(order).job
        if order.targets is None:  # a control plane that cuts the world group only
            job.park(order.epoch, order.target)
            return protocol.Parked()
        plan = Plan(dict(order.targets), {k: list(m) for k, m in (order.members or {}).items()}, order.version)
        needs: list[Need] = job.park(order.epoch, plan)
        return protocol.Parked(version=order.version, needs=[
            protocol.Need(key=n.key, members=list(n.members), count=n.count) for n in needs])

    def _finish(self, order: protocol.Finish) -> protocol.Done:
        """The end of a checkpoint over several nodes: kill the ranks held frozen (the job checkpoint is
        committed), or let them go on."""
        run = self._run_of(order)
        if order.then == "kill":
            run.stopping = True
            run.job.kill()
            self._ship(run)
            self._forget(run)
            return protocol.Done()
        run.job.release(_store(order.rendezvous), rebuild=order.rebuild)
        self._unstop(run)
        return protocol.Done()

    def _kill(self, order: protocol.Kill) -> protocol.Killed:
        run = self.jobs.get(order.job_id)
        if run is not None and run.attempt <= order.attempt:
            statuses = {rp.spec.rank: _status(rp, run.stopped) for rp in run.job.ranks if rp.poll() is not None}
            run.stopped |= {rp.spec.rank for rp in run.job.ranks if rp.spec.rank not in statuses}
            self._stop(run)
            return protocol.Killed(ranks=[statuses.get(rp.spec.rank) or _status(rp, run.stopped)
                                          for rp in run.job.ranks])
        with self.mu:
            attempt, ended = self.ended.get(order.job_id, (-1, []))
        return protocol.Killed(ranks=ended if attempt == order.attempt else [])

    def _forget(self, run: Running) -> None:
        with self.mu:
            if self.jobs.get(run.job_id) is run:
                del self.jobs[run.job_id]

    def _stop(self, run: Running) -> None:
        run.stopping = True
        run.job.kill()
        self._forget(run)

    def _runs(self) -> list[Running]:
        """The jobs running here now."""
        with self.mu:
            return list(self.jobs.values())

    def fence(self) -> None:
        """The lease is lost: another agent may get this node's jobs. Kill every rank now, and run no more
        actions of that lease."""
        with self.mu:
            self.lease = None
            runs = list(self.jobs.values())
        self.prestages.drop_all()  # staged for restores of that lease
        with self.mu:
            dumps, self.local_dumps = list(self.local_dumps.values()), {}
        for dump in dumps:
            _close_later(dump)
        # SIGKILL every rank before waiting for any: each must stop running its code before the control
        # plane requeues its job, however long the others take to be reaped.
        for run in runs:
            run.stopping = True
            for rp in run.job.ranks:
                with contextlib.suppress(Exception):
                    rp.kill(wait=False)
        for run in runs:
            with contextlib.suppress(Exception):
                self._stop(run)

    def hold(self, agent_id: str) -> None:
        """The agent holds a lease again, as ``agent_id``: actions fetched under it run, and what is
        reported goes under that id."""
        with self.mu:
            self.agent_id = self.outbox.agent_id = self.lease = agent_id

    # -- exits and logs ---------------------------------------------------------------------------------
    def _watch(self, run: Running) -> None:
        # Rank by rank, not Job.wait(): that also drops the job's kept images, which Job.kill() (run by
        # a checkpoint-and-kill in the action thread) does too, and the two must not race.
        ranks = run.job.ranks
        ended: dict[int, protocol.RankExit] = {}
        dog = Watchdog()
        while len(ended) < len(ranks):
            for rp in ranks:
                if rp.spec.rank not in ended and rp.poll() is not None:
                    ended[rp.spec.rank] = _status(rp, run.stopped)
            dog.check([rp for rp in ranks if rp.spec.rank not in ended])
            with run.lock:
                stopping = run.stopping
            if not stopping and len(ended) < len(ranks) and any(_failed(st) for st in ended.values()):
                # A rank failed: the others would only hang in their next collective. Stop them.
                alive = [rp for rp in ranks if rp.spec.rank not in ended]
                run.stopped |= {rp.spec.rank for rp in alive}
                for rp in alive:
                    with contextlib.suppress(Exception):
                        rp.kill()
                continue
            if len(ended) < len(ranks):
                time.sleep(0.02)
        statuses = [ended[rp.spec.rank] for rp in ranks]
        with run.lock:
            if run.stopping:
                run.quiet_exit = statuses
                return
        with contextlib.suppress(Exception):
            run.job.wait(5)  # every rank is gone: this only releases what the job kept for later dumps
        self._ship(run)
        self._report_exit(run, statuses)
        self._forget(run)

    def _report_exit(self, run: Running, statuses: list[protocol.RankExit]) -> None:
        with self.mu:
            self.ended[run.job_id] = (run.attempt, statuses)
        self.outbox.put("exits", protocol.ExitReport(agent_id=self.agent_id, job_id=run.job_id,
                                                     attempt=run.attempt, ranks=statuses))

    def node_figures(self) -> dict[str, float]:
        """What the node's staging areas hold (checkpoint images in memory and on disk)."""
        usage = self.node.staging_usage()
        return {"staging_memory_bytes": float(usage["memory"]), "staging_disk_bytes": float(usage["disk"])}

    def progress(self) -> dict[str, dict[str, float]]:
        """What can be seen of each running job: CPU time, memory (on a GPU node, the GPU memory of its
        largest rank too), output so far and, from the interposer, optimizer steps and collectives (with steps
        per second since the previous report)."""
        out: dict[str, dict[str, float]] = {}
        now = time.time()
        runs = self._runs()
        # One NVML reading for all the jobs; none on a CPU node, or with nothing running.
        gpu_memory = process_memory(self.nvml) if self.gpus and runs else {}
        for run in runs:
            rank_pids = [r.pids() for r in run.job.ranks]
            pids = [p for ps in rank_pids for p in ps]
            info: dict[str, float] = {
                "attempt": run.attempt,
                "cpu_s": round(sum(_cpu_seconds(p) for p in pids), 2),
                "rss_bytes": tasks.rss_bytes(pids),
                "output_bytes": sum(run.shipped.values()),
            }
            rank_bytes = _gpu_rank_bytes(rank_pids, gpu_memory)
            if rank_bytes is not None:
                info["gpu_rank_bytes"] = rank_bytes
            stats = [c.last_stat for c in run.job.channels() if c.last_stat]
            if stats:
                steps = max(int(st["steps"]) for st in stats)
                colls = max(int(st["collectives"]) for st in stats)
                info["steps"], info["collectives"] = steps, colls
                if run.rate is not None and now > run.rate[0]:
                    dt = now - run.rate[0]
                    info["steps_per_s"] = round((steps - run.rate[1]) / dt, 3)
                    info["collectives_per_s"] = round((colls - run.rate[2]) / dt, 3)
                run.rate = (now, steps, colls)
            for c in run.job.channels():
                c.request_stat()  # answered by the next report
            out[run.job_id] = info
        with self.mu:
            copying = dict(self._copying)
        for job_id, (attempt, done, total) in copying.items():
            out.setdefault(job_id, {"attempt": attempt}).update(copy_to_go_bytes=total - done,
                                                                 copy_total_bytes=total)
        return out

    def ship_all(self) -> None:
        for run in self._runs():
            try:
                self._ship(run)
            except LeaseLost:
                raise
            except Exception as exc:
                log.debug("log shipping for %s: %s", run.job_id, exc)

    def _ship(self, run: Running) -> None:
        with run.lock:
            for spec in run.specs:
                path = self.node.log_path(spec)
                while True:
                    off = run.shipped.get(spec.rank)
                    try:
                        with path.open("rb") as f:
                            f.seek(off or 0)
                            data = f.read(CHUNK)
                    except FileNotFoundError:
                        data = b""
                    if off is not None and not data:
                        break
                    self.client.call("PUT", f"/v1/agent/{self.client.node}/logs/{run.job_id}/{spec.rank}",
                                     params={"agent_id": self.agent_id, "attempt": run.attempt,
                                             "offset": off or 0}, content=data)
                    run.shipped[spec.rank] = (off or 0) + len(data)


def _queue_of(action: protocol.Action) -> str:
    """The queue an action waits in: its job's, or for a prestage, one of its own beside it."""
    if isinstance(action.order, protocol.Prestage | protocol.Unstage):
        return f"{action.job_id}/prestage"
    return action.job_id


def _pids(job: Job) -> protocol.Started:
    return protocol.Started(ranks=[protocol.RankPid(rank=r.spec.rank, pid=r.pid) for r in job.ranks])


def _close_later(dump: LocalDump) -> None:
    """Remove a local dump's images once its commit has ended (which may take a while), off the caller's thread."""
    threading.Thread(target=dump.close, name=f"tidal-close-{dump.job_id}", daemon=True).start()
