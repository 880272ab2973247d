"""Runs the control plane's actions with the checkpoint mechanism, and reports what happens.

Actions of one job run one after another in arrival order (a kill after a restore finds the restored
ranks); an action id seen before is never run twice: its result is sent again instead. The ranks' exits
are reported unless the agent itself stopped them (checkpoint-and-kill, kill). Log bytes are shipped
from the start of each attempt, so that a restore, whose log starts as the checkpoint's copy, rolls the
served log back with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.agent.client import ControlClient, LeaseLostError
from tidal.agent.devices import CpuQuota
from tidal.config import load_settings
from tidal.errors import CheckpointCorrupt
from tidal.mechanisms.accounts import Account
from tidal.mechanisms.criu import tasks
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import NodeRoot, RankProcess, RankSpec
from tidal.mechanisms.interpose.channel import Store
from tidal.mechanisms.storage import CheckpointStore

log = logging.getLogger(__name__)
CHUNK = 4 << 20


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
    quiet_exit: list[dict[str, Any]] | None = None
    shipped: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: set[int] = field(default_factory=set)  # ranks the agent killed because another one failed
    rate: tuple[float, int, int] | None = None  # (time, steps, collectives) at the previous progress report


def _status(rp: RankProcess, stopped: set[int]) -> dict[str, Any]:
    st = rp.poll()
    assert st is not None
    return {"rank": rp.spec.rank, "code": st.code, "signal": st.signal, "at": rp.exit_time,
            "stopped": rp.spec.rank in stopped}


def _failed(st: dict[str, Any]) -> bool:
    return not st["stopped"] and (st["signal"] is not None or st["code"] != 0)


def _failure(exc: Exception) -> dict[str, Any]:
    """What a failed action's result carries besides its message: a checkpoint that failed verification
    (the control plane marks it bad and restores an older one instead of trying it again)."""
    if isinstance(exc, CheckpointCorrupt):
        f = exc.fields
        return {"corrupt": {"checkpoint": f.get("checkpoint"), "object": f.get("object"), "chunk": f.get("chunk"),
                            "reason": f.get("reason"), "message": exc.message}}
    return {}


def _store(d: dict[str, str] | None) -> Store | None:
    return Store(d["addr"], d["prefix"]) if d else None


class Outbox:
    """Results and exit reports, delivered in order, retried until the control plane has them."""

    def __init__(self, client: ControlClient, agent_id: str, on_lease_lost: Callable[[], None]) -> None:
        self.client = client
        self.agent_id = agent_id
        self.q: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.on_lease_lost = on_lease_lost
        threading.Thread(target=self._run, name="tidal-outbox", daemon=True).start()

    def put(self, path: str, body: dict[str, Any]) -> None:
        self.q.put((path, body))

    def _run(self) -> None:
        while True:
            path, body = self.q.get()
            try:
                self.client.call("POST", f"/v1/agent/{self.client.node}/{path}",
                                 json={**body, "agent_id": self.agent_id})
            except LeaseLostError:
                self.on_lease_lost()
            except Exception:
                log.exception("report %s dropped", path)


class Executor:
    def __init__(self, client: ControlClient, node: NodeRoot, store: CheckpointStore, agent_id: str,
                 on_lease_lost: Callable[[], None], quota: CpuQuota | None = None) -> None:
        self.client = client
        self.quota = quota
        self.node = node
        self.store = store
        self.agent_id = agent_id
        self.outbox = Outbox(client, agent_id, on_lease_lost)
        self.jobs: dict[str, Running] = {}
        self.results: dict[str, dict[str, Any]] = {}  # action id → its result (idempotency)
        self.inflight: set[str] = set()
        self.queues: dict[str, list[dict[str, Any]]] = {}
        self.ended: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # job → (attempt, how its ranks ended)
        self.cut_timeout = load_settings().cut_timeout
        self.mu = threading.Lock()

    # -- actions --------------------------------------------------------------------------------------------
    def submit(self, action: dict[str, Any]) -> None:
        aid = action["id"]
        with self.mu:
            if aid in self.results:
                self.outbox.put("results", self.results[aid])
                return
            if aid in self.inflight:
                return
            self.inflight.add(aid)
            q = self.queues.setdefault(action["job_id"], [])
            q.append(action)
            if len(q) == 1:
                threading.Thread(target=self._drain, args=(action["job_id"],), daemon=True,
                                 name=f"tidal-job-{action['job_id']}").start()

    def _drain(self, job_id: str) -> None:
        while True:
            with self.mu:
                q = self.queues[job_id]
                if not q:
                    del self.queues[job_id]
                    return
                action = q[0]
            self._run(action)
            with self.mu:
                q.pop(0)

    def _run(self, action: dict[str, Any]) -> None:
        handler = getattr(self, f"_do_{action['kind']}")
        try:
            data = handler(action["payload"])
            res = {"action_id": action["id"], "ok": True, "data": data}
        except Exception as exc:
            log.warning("action %s (%s of job %s) failed: %s", action["id"], action["kind"], action["job_id"],
                        exc)
            res = {"action_id": action["id"], "ok": False, "error": str(exc), "data": _failure(exc)}
        with self.mu:
            self.results[action["id"]] = res
            self.inflight.discard(action["id"])
        self.outbox.put("results", res)

    def _specs(self, p: dict[str, Any]) -> list[RankSpec]:
        out = []
        argv = list(p["argv"])
        account = as_account(p.get("unix_user"))
        # torchrun's environment: scripts written for torchrun run unchanged.
        # (The interposer rendezvous on TIDAL_STORE, hosted by Tidal; MASTER_* only for scripts that read it.)
        port = 20000 + zlib.crc32(p["job_id"].encode()) % 20000
        rdv = p.get("rendezvous") or {}
        for r in p["ranks"]:
            env = {**p["env"], "RANK": str(r["rank"]), "LOCAL_RANK": str(r.get("local_rank", r["rank"])),
                   "WORLD_SIZE": str(p["world_size"]),
                   "LOCAL_WORLD_SIZE": str(p.get("local_world_size", p["world_size"])),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TIDAL_JOB_ID": p["job_id"],
                   "TIDAL_NODE": self.client.node}
            if rdv:
                env |= {"TIDAL_STORE": rdv["addr"], "TIDAL_STORE_PREFIX": rdv["prefix"]}
            out.append(RankSpec(p["job_id"], int(r["rank"]), tuple(argv), Path(p["workdir"]), env,
                                tuple(r["cpus"]) if r.get("cpus") else None, account=account))
        return out

    def _started(self, p: dict[str, Any], job: Job, specs: list[RankSpec]) -> dict[str, Any]:
        job.cut_timeout = self.cut_timeout
        if self.quota is not None:
            device = {int(r["rank"]): int(r["device"]) for r in p["ranks"]}
            for rp in job.ranks:
                self.quota.place(device[rp.spec.rank], rp.pid)
        run = Running(p["job_id"], int(p["attempt"]), job, specs)
        with self.mu:
            self.jobs[run.job_id] = run
        threading.Thread(target=self._watch, args=(run,), daemon=True,
                         name=f"tidal-watch-{run.job_id}").start()
        return {"ranks": [{"rank": r.spec.rank, "pid": r.pid} for r in job.ranks]}

    def _existing(self, p: dict[str, Any]) -> dict[str, Any] | None:
        run = self.jobs.get(p["job_id"])
        if run is not None and run.attempt == int(p["attempt"]):
            return {"ranks": [{"rank": r.spec.rank, "pid": r.pid} for r in run.job.ranks]}
        if run is not None:  # an older attempt still here: it must not run beside the new one
            self._stop(run)
        return None

    def _do_launch(self, p: dict[str, Any]) -> dict[str, Any]:
        if (done := self._existing(p)) is not None:
            return done
        specs = self._specs(p)
        job = Job.launch(p["job_id"], [(s, self.node) for s in specs], self.store, track_fs=p.get("fs", True))
        return self._started(p, job, specs)

    def _do_restore(self, p: dict[str, Any]) -> dict[str, Any]:
        if (done := self._existing(p)) is not None:
            return done
        specs = self._specs(p)
        ck = p.get("checkpoint") or {}
        job = Job.restore(self.store, p["job_id"], [(s, self.node) for s in specs], checkpoint_id=ck.get("parts"),
                          rendezvous=_store(p.get("rendezvous")), track_fs=p.get("fs", True))
        return self._started(p, job, specs)

    def _run_of(self, p: dict[str, Any]) -> Running:
        run = self.jobs.get(p["job_id"])
        if run is None or run.attempt != int(p["attempt"]):
            raise RuntimeError(f"job {p['job_id']} attempt {p['attempt']} does not run on {self.client.node}")
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

    def _do_checkpoint(self, p: dict[str, Any]) -> dict[str, Any]:
        run = self._run_of(p)
        then = p["then"]
        cut = p.get("cut")
        if then != "continue":
            run.stopping = True
        try:
            info = run.job.checkpoint(then, checkpoint_id=p.get("checkpoint_id"),
                                      cut_at=(int(cut["epoch"]), int(cut["target"])) if cut else None,
                                      rendezvous=_store(p.get("rendezvous")))
        except BaseException:
            self._unstop(run)
            raise
        if then == "kill":
            self._ship(run)
            self._forget(run)
        if "keep_ids" in p:
            # Retention by the control plane's list: parts of the newest committed checkpoints, and those of
            # the checkpoint being written on the job's other nodes.
            self.store.keep_only(p["job_id"], set(p["keep_ids"]) | {info.id})
        return {"checkpoint": {"id": info.id, "created_at": info.created_at, "bytes": info.logical_bytes,
                               "stored_bytes": info.stored_bytes}}

    def _do_cut(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"counts": self._run_of(p).job.counts(int(p["epoch"]))}

    def _do_park(self, p: dict[str, Any]) -> dict[str, Any]:
        self._run_of(p).job.park(int(p["epoch"]), int(p["target"]))
        return {}

    def _do_finish(self, p: dict[str, Any]) -> dict[str, Any]:
        """The end of a checkpoint over several nodes: kill the ranks held frozen (the job checkpoint is
        committed), or let them go on."""
        run = self._run_of(p)
        if p["then"] == "kill":
            run.stopping = True
            run.job.kill()
            self._ship(run)
            self._forget(run)
            return {}
        run.job.release(_store(p.get("rendezvous")), rebuild=bool(p.get("rebuild")))
        self._unstop(run)
        return {}

    def _do_kill(self, p: dict[str, Any]) -> dict[str, Any]:
        run = self.jobs.get(p["job_id"])
        if run is not None and run.attempt <= int(p["attempt"]):
            statuses = {rp.spec.rank: _status(rp, run.stopped) for rp in run.job.ranks if rp.poll() is not None}
            run.stopped |= {rp.spec.rank for rp in run.job.ranks if rp.spec.rank not in statuses}
            self._stop(run)
            ended = [statuses.get(rp.spec.rank) or _status(rp, run.stopped) for rp in run.job.ranks]
            return {"ranks": ended}
        with self.mu:
            attempt, ended = self.ended.get(p["job_id"], (-1, []))
        return {"ranks": ended if attempt == int(p["attempt"]) else []}

    def _forget(self, run: Running) -> None:
        with self.mu:
            if self.jobs.get(run.job_id) is run:
                del self.jobs[run.job_id]

    def _stop(self, run: Running) -> None:
        run.stopping = True
        run.job.kill()
        self._forget(run)

    def fence(self) -> None:
        """The lease is lost: another agent may get this node's jobs. Kill every rank now."""
        with self.mu:
            runs = list(self.jobs.values())
        for run in runs:
            with contextlib.suppress(Exception):
                self._stop(run)

    # -- exits and logs ---------------------------------------------------------------------------------
    def _watch(self, run: Running) -> None:
        # Rank by rank, not Job.wait(): that also drops the job's kept images, which Job.kill() (run by
        # a checkpoint-and-kill in the action thread) does too, and the two must not race.
        ranks = run.job.ranks
        ended: dict[int, dict[str, Any]] = {}
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

    def _report_exit(self, run: Running, statuses: list[dict[str, Any]]) -> None:
        with self.mu:
            self.ended[run.job_id] = (run.attempt, statuses)
        self.outbox.put("exits", {"job_id": run.job_id, "attempt": run.attempt, "ranks": statuses})

    def progress(self) -> dict[str, dict[str, float]]:
        """What can be seen of each running job: CPU time, memory, output so far and, from the interposer,
        optimizer steps and collectives (with steps per second since the previous report)."""
        out: dict[str, dict[str, float]] = {}
        with self.mu:
            runs = list(self.jobs.values())
        now = time.time()
        for run in runs:
            pids = [p for r in run.job.ranks for p in r.pids()]
            info: dict[str, float] = {
                "attempt": run.attempt,
                "cpu_s": round(sum(_cpu_seconds(p) for p in pids), 2),
                "rss_bytes": tasks.rss_bytes(pids),
                "output_bytes": sum(run.shipped.values()),
            }
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
        return out

    def ship_all(self) -> None:
        with self.mu:
            runs = list(self.jobs.values())
        for run in runs:
            try:
                self._ship(run)
            except LeaseLostError:
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
