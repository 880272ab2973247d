"""``tidal run``: a command's ranks inside a Slurm job, checkpointed at Slurm's warning, restored when Slurm
starts the job again.

On start it looks for the job's last committed checkpoint in the store (keyed by the Slurm job id, or
``--key``) and restores the ranks from it, or launches them. Their output is copied to this process's
standard output (Slurm's ``--output`` file) from where the restored log ends, so that the file continues
exactly. On SIGUSR1 (``sbatch --signal=B:USR1@SECONDS``: the time limit is near) the ranks are cut,
checkpointed and killed, and the job is requeued (``scontrol requeue``); on SIGTERM (preemption with
``PreemptMode=REQUEUE``: Slurm requeues the job itself after its ``GraceTime``; or ``scancel``) they are
checkpointed and killed too. ``--checkpoint-every`` adds periodic checkpoints, which a job restarted after
a node failure resumes from. A checkpoint that fails leaves the last committed one as it was: the job is
then started again from that one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from tidal.config import load_settings
from tidal.errors import CheckpointError, ConfigError, RankExited, TidalError, Unsupported, ValidationError
from tidal.mechanisms.criu import cgroups, tasks
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.provision import find_criu
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec, become_subreaper
from tidal.mechanisms.interpose.channel import Store
from tidal.mechanisms.interpose.storeserver import RendezvousServer
from tidal.mechanisms.slurm import multitask, scontrol
from tidal.mechanisms.slurm.step import SlurmStep
from tidal.mechanisms.storage import CheckpointStore, store_options
from tidal.waiting import wait_until

STORE_ENV = "TIDAL_CHECKPOINT_STORE"
# The environment of what tidal run starts itself (CRIU, scontrol): nothing of the job's but Tidal's settings.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class RunOptions:
    argv: tuple[str, ...]
    store: str | None = None
    key: str | None = None
    checkpoint_every: float | None = None
    ranks_per_node: int = 1
    keep: int = 2  # committed checkpoints kept per job


def check_options(opts: RunOptions, env: Mapping[str, str]) -> str:
    """The store's URL; a clear error for anything else that cannot work."""
    if not opts.argv:
        raise ValidationError("tidal run needs a command: tidal run [OPTIONS] -- CMD ...", field="argv",
                              hint="e.g. tidal run -- python train.py")
    if opts.ranks_per_node < 1:
        raise ValidationError(f"--ranks-per-node must be at least 1, not {opts.ranks_per_node}",
                              field="ranks_per_node", hint="give the number of ranks to run on each node")
    if opts.checkpoint_every is not None and opts.checkpoint_every <= 0:
        raise ValidationError(f"--checkpoint-every must be a positive number of seconds, not {opts.checkpoint_every}",
                              field="checkpoint_every", hint="e.g. --checkpoint-every 600")
    url = opts.store or env.get(STORE_ENV)
    if not url:
        raise ConfigError("tidal run has no checkpoint store: give --store URL or set TIDAL_CHECKPOINT_STORE",
                          field="store", hint="a directory on storage every node mounts at the same path, or an "
                                              "s3:// URL; a node-local directory would not follow the job to "
                                              "other nodes")
    return url


def not_job_state(workdir: Path, paths: tuple[Path, ...], fds: tuple[int, ...] = (1, 2)) -> frozenset[str]:
    """What under ``workdir`` is not the job's state: the files this process's standard output and error go to
    (Slurm's ``--output`` and ``--error``, open for the whole job), and ``paths`` (the store and Tidal's own
    directories, where they lie inside it). Never saved into a checkpoint, never put back."""
    targets = list(paths)
    for fd in fds:
        with contextlib.suppress(OSError):
            targets.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
    out = set()
    base = workdir.resolve()
    for t in targets:
        with contextlib.suppress(ValueError, OSError):
            rel = t.resolve().relative_to(base).as_posix()
            if rel != ".":
                out.add(rel)
    return frozenset(out)


class _Forwarder(threading.Thread):
    """Copies what a rank writes to its log, from ``offset`` on, to ``out``: whole lines, so that the lines
    of several ranks do not run together."""

    def __init__(self, log: Path, offset: int, out: BinaryIO, lock: threading.Lock, whole_lines: bool) -> None:
        super().__init__(name=f"tidal-forward-{log.parent.name}", daemon=True)
        self.log, self.offset, self.out, self.lock, self.whole_lines = log, offset, out, lock, whole_lines
        self.done = threading.Event()
        self.limit: int | None = None  # where the output ends: the checkpoint's copy of the log

    def _pump(self, final: bool) -> None:
        try:
            with self.log.open("rb") as f:
                f.seek(self.offset)
                data = f.read(-1 if self.limit is None else max(0, self.limit - self.offset))
        except FileNotFoundError:
            return
        if self.whole_lines and not final:
            data = data[: data.rfind(b"\n") + 1]
        if data:
            with self.lock:
                self.out.write(data)
                self.out.flush()
            self.offset += len(data)

    def run(self) -> None:
        while not self.done.wait(0.05):
            self._pump(False)
        self._pump(True)

    def finish(self, limit: int | None = None) -> None:
        """Copy what is left, up to ``limit`` bytes of the log."""
        self.limit = limit
        self.done.set()
        self.join(10)


@dataclass(frozen=True)
class Site:
    """Where a task runs: the store, its node root (and that root's directory), the job's working directory
    and what in it is not the job's state."""

    store: CheckpointStore
    node: NodeRoot
    root: Path
    workdir: Path
    ignore: frozenset[str]


class SlurmRun:
    """One ``tidal run`` task."""

    def __init__(self, opts: RunOptions, env: Mapping[str, str], out: BinaryIO, err: TextIO) -> None:
        self.opts = opts
        self.job_env = dict(env)  # what the ranks' commands get (torchrun's variables added)
        self.out, self.err = out, err
        self.url = check_options(opts, env)
        self.step = SlurmStep.from_env(env, opts.key)
        if self.step.tasks > 1 and len(set(self.step.nodes)) < self.step.tasks:
            raise Unsupported(f"tidal run runs one task per node, and this step has {self.step.tasks} tasks on "
                              f"{len(set(self.step.nodes))} node(s)",
                              hint="give the step one task per node (srun --ntasks-per-node 1) and each task its "
                                   "node's ranks with --ranks-per-node")
        self.stop_signal: str | None = None
        self.wake = threading.Event()
        self.rendezvous: RendezvousServer | None = None
        self.rendezvous_addr = ""  # where the ranks of every node reach it
        self.site: Site  # once run() has prepared it
        self._forwarders: list[tuple[_Forwarder, int]] = []
        # Where each rank's output ends once it is checkpointed and killed: what its pipe held at the dump is
        # in the image, and the restored rank writes it again, so the live log's copy of it is not forwarded.
        self.log_ends: dict[int, int] = {}

    def say(self, msg: str) -> None:
        print(f"tidal run: {msg}", file=self.err, flush=True)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stop_signal is None:
            self.stop_signal = signal.Signals(signum).name
        self.wake.set()

    def specs(self, workdir: Path, master_addr: str, rendezvous: Store | None) -> list[RankSpec]:
        """This task's ranks: the job's environment with torchrun's variables, Tidal's rendezvous added."""
        k = self.opts.ranks_per_node
        extra: dict[str, str] = {"TIDAL_JOB_ID": self.step.key, "TIDAL_NODE": self.step.node}
        if rendezvous is not None:
            extra |= {"TIDAL_STORE": rendezvous.addr, "TIDAL_STORE_PREFIX": rendezvous.prefix}
        return [RankSpec(self.step.key, self.step.task * k + i, self.opts.argv, workdir,
                         {**self.job_env, **self.step.rank_env(i, k, master_addr), **extra})
                for i in range(k)]

    def host_rendezvous(self) -> RendezvousServer:
        """Start the ranks' rendezvous store here. In a session of its own, so that the SIGTERM Slurm sends
        this process group does not end it before the ranks are checkpointed; it lives while this process
        holds the lock on its lifeline."""
        root = self.site.root
        lifeline = root / "rendezvous.lock"
        self._lifeline = os.open(lifeline, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lifeline, fcntl.LOCK_EX)
        self.rendezvous = RendezvousServer(lifeline=lifeline, log=root / "rendezvous.log")
        self.rendezvous_addr = self.rendezvous.addr
        return self.rendezvous

    def forward(self, job: Job, specs: list[RankSpec], offsets: dict[int, int], node: NodeRoot) -> None:
        """Copy each rank's output, from ``offsets``, to this process's standard output (Slurm's file)."""
        lock = threading.Lock()
        for s in specs:
            f = _Forwarder(node.log_path(s), offsets[s.rank], self.out, lock, len(specs) > 1)
            f.start()
            self._forwarders.append((f, s.rank))

    def end_forwarding(self, log_ends: dict[int, int]) -> None:
        """Copy what is left of the ranks' output: up to ``log_ends`` of a rank checkpointed and killed (what
        its pipe held at the dump is in the image, and the restored rank writes it again)."""
        for f, rank in self._forwarders:
            f.finish(log_ends.get(rank))
        self._forwarders.clear()

    def _reclaim(self, node: NodeRoot) -> None:
        """Ranks an earlier run of this job left on this node (its tidal run killed during a checkpoint, its
        ranks still frozen): Slurm started the job again, so they are dead weight, and they hold the cgroups
        the new ranks need."""
        for group in cgroups.hierarchy().rank_groups(node.name):
            left = group.kill()
            if left:
                self.say(f"killed {len(left)} process(es) an earlier run of job {self.step.key} left on "
                         f"{self.step.node}")
            group.wait_empty(10)
            group.remove()

    def _prepare(self) -> Site:
        """What every task needs before its ranks start; also checks that CRIU works here."""
        settings = load_settings()
        # What runs as root from here (CRIU, scontrol) takes nothing from the job's environment.
        tidal_vars = {k: v for k, v in os.environ.items() if k.startswith("TIDAL_")}
        os.environ.clear()
        os.environ.update({"PATH": SAFE_PATH, "LC_ALL": "C", **tidal_vars,
                           **{k: v for k, v in self.job_env.items() if k == "SLURM_CONF"}})
        store = CheckpointStore(self.url, **store_options(settings, self.url))
        key, node_name = self.step.key, self.step.node
        try:
            try:
                find_criu()
            except TidalError as exc:
                latest = multitask.latest(store, key) if self.step.tasks > 1 else store.latest(key)
                if latest is not None:
                    raise CheckpointError(f"cannot restore job {key} on node {node_name}: CRIU is not usable here "
                                          f"({exc.message})", object=latest.id,
                                          hint="install CRIU ≥ 4.0 on every node (`tidal doctor --slurm`), then "
                                               f"requeue the job; its checkpoint {latest.id} is kept") from exc
                raise CheckpointError(f"cannot run job {key} on node {node_name}: CRIU is not usable here "
                                      f"({exc.message}), so the job could not be checkpointed",
                                      hint=exc.hint) from exc
            become_subreaper()
            root = settings.home / "slurm" / key / node_name
            node = NodeRoot.of_agent(f"slurm-{key}-{node_name}", root)
            self._reclaim(node)
            workdir = Path.cwd()
            local_store = None if "://" in self.url and not self.url.startswith("file://") else \
                Path(self.url.removeprefix("file://"))
            ignore = not_job_state(workdir, (settings.home, *([local_store] if local_store else []),
                                             *self._output_files()))
        except BaseException:
            store.close()
            raise
        return Site(store, node, root, workdir, ignore)

    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.site = site = self._prepare()
        store, node = site.store, site.node
        try:
            code = multitask.StepTask(self, site).run() if self.step.tasks > 1 else self._run_alone(site)
            if code is None:  # checkpointed (or failed to) and stopped: Slurm starts the job again
                if self.step.task == 0:
                    if self.rendezvous is not None:  # before the requeue, which may end this process
                        self.rendezvous.close()
                    self._requeue()
                return 0
            return code
        finally:
            if self.rendezvous is not None:
                self.rendezvous.close()
            store.close()
            # The node's cgroup directory: its rank groups are gone with the ranks (a group still holding
            # exiting processes keeps it, and the next run on this node reclaims it).
            with contextlib.suppress(OSError):
                cgroups.hierarchy().node_path(node.name).rmdir()

    def _run_alone(self, site: Site) -> int | None:
        """The step's one task: its ranks, on this node."""
        store, node, key = site.store, site.node, self.step.key
        rdv = None
        if self.opts.ranks_per_node > 1:
            self.host_rendezvous()
            rdv = Store(self.rendezvous_addr, f"slurm-{key}")
        specs = self.specs(site.workdir, "127.0.0.1", rdv)
        placement = [(s, node) for s in specs]
        offsets = {s.rank: 0 for s in specs}
        latest = store.latest(key)
        if latest is not None:
            # The output continues from where the checkpoint's copy of each rank's log ends (the ranks
            # run on as soon as they are restored).
            ranks_meta = store.reader(key, latest.id).meta["ranks"]
            offsets = {s.rank: int(ranks_meta[str(s.rank)]["log_bytes"]) for s in specs}
            job = Job.restore(store, key, placement, rendezvous=rdv, fs_ignore=site.ignore)
            self.say(f"job {key} restored from checkpoint {latest.id} on {self.step.node}")
        else:
            job = Job.launch(key, placement, store, fs_ignore=site.ignore)
        self.forward(job, specs, offsets, node)
        try:
            code = self._supervise(job, store)
        finally:
            self.end_forwarding(self.log_ends)
        if code == 0:
            store.delete_job(key)  # done: a job resubmitted under this key starts anew
        return code

    def _supervise(self, job: Job, store: CheckpointStore) -> int | None:
        """Until the ranks end (their exit code) or a signal stops them (None)."""
        every = self.opts.checkpoint_every
        next_at = time.monotonic() + every if every else None
        while True:
            if all(not r.running for r in job.ranks):
                statuses = job.wait(30)
                bad = [s for s in statuses if not s.ok]
                if not bad:
                    return 0
                return bad[0].code if bad[0].code is not None else 128 + (bad[0].signal or 0)
            if self.wake.wait(0.1):
                return self._stop(job, store)
            if next_at is not None and time.monotonic() >= next_at:
                try:
                    _await_started(job)
                    info = job.checkpoint("continue", keep=self.opts.keep)
                    self.say(f"periodic checkpoint {info.id} of job {job.job_id} committed")
                except RankExited:
                    pass  # the ranks are ending: their exit is seen next
                except TidalError as exc:
                    self.say(f"periodic checkpoint of job {job.job_id} failed: {exc.message} (the job goes on)")
                next_at = time.monotonic() + (every or 0)

    def _stop(self, job: Job, store: CheckpointStore) -> int | None:
        """Checkpoint and kill the ranks (None: Slurm starts the job again), or, if they ended meanwhile,
        their exit code."""
        why = self.stop_signal
        try:
            _await_started(job)
            info = job.checkpoint("kill", keep=self.opts.keep)
            ranks_meta = store.reader(job.job_id, info.id).meta["ranks"]
            self.log_ends = {int(r): int(m["log_bytes"]) for r, m in ranks_meta.items()}
            self.say(f"{why}: checkpoint {info.id} of job {job.job_id} committed; it goes on from there when "
                     "Slurm starts it again")
        except RankExited:
            # The signal came as the ranks were ending: if they all have, the job is done, not requeued.
            with contextlib.suppress(Exception):
                statuses = job.wait(10)
                bad = [st for st in statuses if not st.ok]
                if not bad:
                    return 0
                return bad[0].code if bad[0].code is not None else 128 + (bad[0].signal or 0)
            with contextlib.suppress(Exception):
                job.kill()
            self.say(f"{why}: a rank of job {job.job_id} ended during its checkpoint; the job is stopped")
            return 1
        except TidalError as exc:
            with contextlib.suppress(Exception):
                job.kill()
            last = store.latest(job.job_id)
            since = f"its last checkpoint {last.id}" if last else "its start"
            self.say(f"{why}: checkpoint of job {job.job_id} failed: {exc.message}; when Slurm starts it again it "
                     f"goes on from {since}, nothing committed is lost")
        return None

    def _requeue(self) -> None:
        """At the time limit's warning (USR1), Slurm would end the job: ask it to requeue it instead. On
        preemption (TERM) Slurm requeues the job itself, except a step's tasks stopped within the GraceTime
        (Slurm signals them at its start): a job that then ends by itself would count as completed, so it
        is requeued here. A TERM of ``scancel`` leaves no preemption time on the job: it stays cancelled."""
        if self.step.job_id is None:
            return
        if self.stop_signal != "SIGUSR1" and not (self.stop_signal == "SIGTERM" and self.step.tasks > 1
                                                    and self._being_preempted()):
            return
        out = subprocess.run(["scontrol", "requeue", self.step.job_id], capture_output=True, text=True,
                             check=False, timeout=60)
        if out.returncode != 0:
            self.say(f"scontrol requeue {self.step.job_id} failed: {out.stderr.strip()}; the checkpoint is kept: "
                     f"resubmit the job with --key {self.step.key} to go on")

    def _job_fields(self) -> dict[str, str]:
        """``scontrol show job`` of this job, as its fields (empty outside Slurm, or where it fails)."""
        if self.step.job_id is None:
            return {}
        return scontrol.show("job", self.step.job_id, timeout=60)

    def _output_files(self) -> list[Path]:
        """The job's ``--output`` and ``--error`` files: under ``srun`` this task's standard streams are pipes
        to Slurm, so they are not found through them. Restoring them as the checkpoint saw them would cut off
        what Slurm writes to them now."""
        if self.step.tasks == 1:
            return []  # tidal run is the batch script: its own streams are those files
        fields = self._job_fields()
        return [Path(fields[k]) for k in ("StdOut", "StdErr") if fields.get(k, "").startswith("/")]

    def _being_preempted(self) -> bool:
        """Whether Slurm has chosen this job for preemption (its ``PreemptTime`` is set)."""
        return self._job_fields().get("PreemptTime", "None") not in ("None", "Unknown", "")


def _await_started(job: Job, timeout: float = 10.0) -> None:
    """A rank just launched can be dumped once its init leads its session and runs the command: a signal
    may come sooner than that."""
    def started() -> bool:
        for r in job.ranks:
            if not r.running:
                continue
            try:
                if os.getsid(r.pid) != r.pid or len(tasks.descendants(r.pid)) < 2:
                    return False
            except (ProcessLookupError, OSError):
                continue
        return True

    wait_until(started, timeout=timeout, what=f"the ranks of job {job.job_id} to start")


def run(opts: RunOptions) -> int:
    """``tidal run``, with this process's environment and standard streams."""
    return SlurmRun(opts, os.environ, sys.stdout.buffer, sys.stderr).run()
