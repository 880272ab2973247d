"""A rank: one process tree in its own PID namespace under a Tidal init, checkpointable with CRIU.

The owner (the node agent, or a test) launches or restores ranks and must be a child subreaper so that
a rank's init is its child in both cases (a restored tree is re-parented to the nearest subreaper when
``criu restore --restore-detached`` exits). The rank's stdout and stderr go to one pipe whose other end
the owner pumps into the log file; the init's status pipe is the owner's lifeline to the rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tidal.errors import MechanismError, RankExited
from tidal.mechanisms.accounts import Account
from tidal.mechanisms.criu import cgroups, tasks
from tidal.mechanisms.criu.discard import empty_trash
from tidal.mechanisms.criu.logpump import pump
from tidal.mechanisms.criu.memory import mem_available
from tidal.mechanisms.criu.ramdisk import fast_root
from tidal.mechanisms.criu.runner import CriuRunner, TransientDumpError
from tidal.mechanisms.interpose import SITE_DIR
from tidal.mechanisms.interpose.channel import RankChannel
from tidal.mechanisms.permissions import private_dir

INIT = Path(__file__).with_name("rankinit.py")
PR_SET_CHILD_SUBREAPER = 36
# The whole environment of a rank's init, which runs as root: nothing of the job's (PATH, LD_PRELOAD,
# PYTHONPATH ... would choose the code root runs). The job's environment reaches only its command, once
# that runs as the job's account.
INIT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise MechanismError("prctl(PR_SET_CHILD_SUBREAPER) failed",
                             hint="Tidal needs Linux ≥ 3.4 and must run as root; see `tidal doctor`")


@dataclass(frozen=True)
class RankSpec:
    """What to run for one rank of a job."""

    job_id: str
    rank: int
    argv: tuple[str, ...]
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None  # the device's CPU set; None: all CPUs
    # Load the interposer into the rank's first Python process (torch.distributed made checkpointable).
    interpose: bool = True
    account: Account | None = None  # None: the owner's own account
    # A PID namespace of its own (restores never meet a PID in use). None: all but ranks given GPUs
    # (CUDA_VISIBLE_DEVICES set): the CUDA driver cannot start in a PID namespace without a /proc of its
    # own, and CRIU cannot dump a rank in a mount namespace of its own on these hosts. Such a rank is
    # restored with its PIDs, which must then be free on the node.
    own_pidns: bool | None = None

    @property
    def pidns(self) -> bool:
        return self.own_pidns if self.own_pidns is not None else "CUDA_VISIBLE_DEVICES" not in self.env

    @property
    def name(self) -> str:
        return f"{self.job_id}.r{self.rank}"

    def launch_env(self) -> dict[str, str]:
        env = dict(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("OMP_NUM_THREADS", str(len(self.cpus) if self.cpus else os.cpu_count() or 1))
        if self.interpose:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH")) if p)
        return env


FAST_STAGING = Path(os.environ.get("TIDAL_FAST_STAGING", "/dev/shm"))


class NodeRoot:
    """A node root: Tidal's private directories for one node on disk (rank logs, staging images), as the
    agent and the CRIU mechanisms see it. Not the scheduler's node (:class:`tidal.core.topology.Node`, a
    name and a device count). Several node roots on one machine make migration between them real.

    CRIU images are staged in memory (under ``/dev/shm``; ``TIDAL_FAST_STAGING`` moves it) when it has
    room for them: they are written once and read once, and on the store's disk they would only add to
    what the commit has to flush. A dump goes to Tidal's large-page tmpfs (``tidal/``, see
    :mod:`~tidal.mechanisms.criu.ramdisk`), into the memory of the job's last dump, freed just before (or,
    for a job that stops and has none, memory made ready while it ran: :mod:`~tidal.mechanisms.criu.warmup`);
    images fetched from the store go to 4 KiB pages (``tidal-fetched/``). On a virtual machine that
    returns free memory to its host, fresh large pages are the slowest to get: fetching 1.25 GiB took
    2.3–3.8 s into large pages and 1.4–1.5 s into small ones on the reference machine."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        private_dir(root)
        os.chmod(root, 0o700)
        digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
        self._fast = FAST_STAGING / "tidal" / f"{name}-{digest}"
        self._fetched = FAST_STAGING / "tidal-fetched" / f"{name}-{digest}"

    @classmethod
    def of_agent(cls, name: str, root: Path) -> NodeRoot:
        """The node root an agent called ``name`` serves from ``root``. Its key names the node's cgroups:
        unique per node root, so that two clusters on one machine that both have a "node-1" never meet."""
        root = root.resolve()
        return cls(f"{name}-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}", root)

    def rank_dir(self, spec: RankSpec) -> Path:
        return private_dir(self.root / "ranks" / spec.job_id / str(spec.rank))

    def log_path(self, spec: RankSpec) -> Path:
        return self.rank_dir(spec) / "output.log"

    def clear_staging(self) -> None:
        """Drop every staging area of this node root (images kept for the next dump, half-done restores):
        call only when no rank of it runs, e.g. when an agent takes the node over. What a dead owner left
        in ``/dev/shm`` would otherwise hold memory until the machine reboots."""
        for area in (self._fast, self._fetched, self.root / "staging"):
            shutil.rmtree(area, ignore_errors=True)
            empty_trash(area)

    def staging_usage(self) -> dict[str, int]:
        """Bytes this node root's staging areas hold now, as allocated: ``memory`` (its areas under
        ``/dev/shm``: images of dumps, the last dump kept for the next one, fetched images) and ``disk``
        (``staging/``, where images go when memory has no room)."""
        return {"memory": _allocated(self._fast) + _allocated(self._fetched), "disk": _allocated(self.root / "staging")}

    def staging(self, name: str, need_bytes: int = 0, *, fetched: bool = False) -> Path:
        """A private scratch directory for ``need_bytes`` of images: in memory when there is room.
        ``fetched``: for images fetched from the store rather than dumped (see the class)."""
        if need_bytes and FAST_STAGING.is_dir():
            try:
                root = FAST_STAGING if fetched else fast_root(FAST_STAGING)
                free = min(shutil.disk_usage(root).free, mem_available())  # tmpfs lives in RAM
            except OSError:
                free = 0
            if free >= need_bytes * 1.25 + (1 << 30):
                return private_dir((self._fetched if fetched else self._fast) / name, below=FAST_STAGING)
        return private_dir(self.root / "staging" / name)

    def in_memory(self, staging: Path) -> bool:
        """Whether a staging area of :meth:`staging` for a dump is in memory (Tidal's large-page tmpfs)."""
        return staging.is_relative_to(self._fast)


def _allocated(top: Path) -> int:
    """Bytes allocated to the files below ``top`` (none where it does not exist); what is removed while it is
    walked is left out."""
    total = 0
    stack = [str(top)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    with contextlib.suppress(OSError):
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class ExitStatus:
    code: int | None = None
    signal: int | None = None

    @property
    def ok(self) -> bool:
        return self.code == 0

    def __str__(self) -> str:
        return f"exit code {self.code}" if self.signal is None else f"killed by signal {self.signal}"


@dataclass(frozen=True)
class RankDump:
    """A rank dumped into a local directory: CRIU images plus what restore needs to rewire it."""

    rank: int
    images: Path
    log_bytes: int
    out_pipe: str  # "pipe:[inode]" of the rank's output pipe, for --inherit-fd at restore
    status_pipe: str
    ctl_in_pipe: str | None = None  # the interposer channel: requests in, replies out
    ctl_out_pipe: str | None = None
    interposed: bool = False  # the rank's interposer had said hello


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _pipe_pair() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    return r, w


class RankProcess:
    """A running rank on a node. Create with :meth:`launch` or :meth:`restore`."""

    def __init__(self, spec: RankSpec, node: NodeRoot, pid: int, out_r: int, status_r: int,
                 ctl: tuple[int, int] | None = None) -> None:
        self.spec = spec
        self.node = node
        self.pid = pid
        # The rank's group: frozen across a dump, killed as one. On cgroup2 a device's CPU quota moves it
        # (:meth:`tidal.mechanisms.criu.cgroups.Hierarchy.place`); ``key`` names the rank on this node.
        self.cgroup = cgroups.hierarchy().rank(node.name, spec.name)
        self.key = f"{node.name}/{spec.name}"
        self._out_r = out_r
        self._status_r = status_r
        self._status_text = b""
        self._exit: ExitStatus | None = None
        self.exit_time: float | None = None  # wall clock, when its init was seen to end
        self._exited = threading.Event()
        self._frozen = False
        self._pager: subprocess.Popen[bytes] | None = None  # fills in a lazily restored rank's memory
        self._killed = False
        p = pump()
        self._out_closed = p.add_file(out_r, node.log_path(spec))
        p.add(status_r, self._on_status, self._on_status_eof)
        # The owner's ends of the interposer channel: it reads replies, writes requests.
        self.channel = RankChannel(spec.name, *ctl) if ctl else None

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def launch(cls, spec: RankSpec, node: NodeRoot) -> RankProcess:
        if not spec.workdir.is_absolute():
            raise MechanismError(f"working directory must be an absolute path, got {spec.workdir}",
                                 hint="give the rank's working directory as an absolute path")
        if not spec.workdir.is_dir():
            raise MechanismError(f"working directory {spec.workdir} does not exist",
                                 hint="it must exist at the same path on every node")
        if not spec.argv:
            raise MechanismError("empty command", hint="give the program to run and its arguments")
        cgroups.hierarchy()  # a host with no usable cgroup is refused before anything starts
        out_r, out_w = _pipe_pair()
        st_r, st_w = _pipe_pair()
        ctl_r, ctl_w = _pipe_pair()
        go_r, go_w = _pipe_pair()
        in_r, in_w = _pipe_pair()  # interposer requests
        rep_r, rep_w = _pipe_pair()  # interposer replies
        spec_r, spec_w = _pipe_pair()  # what the init runs, and as whom
        log = node.log_path(spec)
        log.unlink(missing_ok=True)
        env = spec.launch_env()
        if spec.interpose:
            env["TIDAL_INTERPOSE_CTL"] = f"{in_r},{rep_w}"
        acct = spec.account
        payload = json.dumps({"argv": list(spec.argv), "env": env, "cwd": str(spec.workdir),
                              "uid": acct.uid if acct else None, "gid": acct.gid if acct else None,
                              "groups": list(acct.groups) if acct else [], "pidns": spec.pidns}).encode()
        try:
            # Absolute paths, a fixed environment and "/" as working directory: see INIT_ENV.
            launcher = subprocess.Popen(
                [sys.executable, "-I", "-S", str(INIT), str(ctl_w), str(go_r), str(st_w), str(spec_r)],
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                pass_fds=(ctl_w, go_r, st_w, in_r, rep_w, spec_r), cwd="/", env=INIT_ENV, start_new_session=True)
        except BaseException:
            os.close(spec_w)
            raise
        finally:
            for fd in (out_w, st_w, ctl_w, go_r, in_r, rep_w, spec_r):
                os.close(fd)
        try:
            _send(spec_w, payload)
        except OSError:
            pass  # the launcher died: reported below as a failed start
        finally:
            os.close(spec_w)
        try:
            ready, _, _ = select.select([ctl_r], [], [], 30)
            line = os.read(ctl_r, 64) if ready else b""
            launcher.wait(30)
            if not line.strip().isdigit():
                raise MechanismError(f"rank {spec.name} failed to start its namespace "
                                     f"(launcher exit code {launcher.returncode})",
                                     hint="Tidal needs root (CLONE_NEWPID) to run ranks")
            pid = int(line)
            rank = cls(spec, node, pid, out_r, st_r, (rep_r, in_w))
            _await_predecessor(rank.key)
            rank.cgroup.create()
            rank.cgroup.add(pid)
            if spec.cpus:
                tasks.set_affinity([pid], spec.cpus)
            os.write(go_w, b"g")
        except BaseException:
            if "rank" not in locals():
                for fd in (out_r, st_r, rep_r, in_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            # Else the log pump owns the read ends: they close when the init, which never gets its go
            # byte, exits (closing them here would let a later pipe reuse a number the pump still watches).
            raise
        finally:
            os.close(ctl_r)
            os.close(go_w)
        return rank

    @classmethod
    def restore(cls, spec: RankSpec, node: NodeRoot, dump: RankDump, runner: CriuRunner,
                lazy: bool = False) -> RankProcess:
        """Restore a dumped rank on ``node`` (its log file must already hold the dump's log). ``lazy``: it
        resumes before its memory is all in (see :meth:`CriuRunner.restore`); :meth:`settle` waits for
        that, and the images must stay until then."""
        cgroups.hierarchy()  # a host with no usable cgroup is refused before anything starts
        out_r, out_w = _pipe_pair()
        st_r, st_w = _pipe_pair()
        inherit = {out_w: dump.out_pipe, st_w: dump.status_pipe}
        ours: list[int] = [out_r, st_r]  # the owner keeps these
        theirs: list[int] = [out_w, st_w]  # the restored rank gets these
        ctl = None
        if dump.ctl_in_pipe and dump.ctl_out_pipe:
            in_r, in_w = _pipe_pair()
            rep_r, rep_w = _pipe_pair()
            inherit |= {in_r: dump.ctl_in_pipe, rep_w: dump.ctl_out_pipe}
            ours += [rep_r, in_w]
            theirs += [in_r, rep_w]
            ctl = (rep_r, in_w)
        pidfile = dump.images / "restore.pid"
        pidfile.unlink(missing_ok=True)
        try:
            pager = runner.restore(dump.images, pidfile=pidfile, inherit=inherit, lazy=lazy)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        pid = int(pidfile.read_text())
        rank = cls(spec, node, pid, out_r, st_r, ctl)
        rank._pager = pager
        if rank.channel is not None and dump.interposed:
            rank.channel.hello.set()  # it said hello before the dump
        # CRIU left the tree stopped: place it, then let it run. A stopped init cannot notice that its
        # owner is gone, so if placing fails the tree must be killed here.
        try:
            procs = tasks.descendants(pid)
            _await_predecessor(rank.key)
            rank.cgroup.create()
            for p in procs:
                rank.cgroup.add(p)
            if spec.cpus:
                tasks.set_affinity(procs, spec.cpus)
        except BaseException:
            with contextlib.suppress(Exception):
                rank.kill()
            raise
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        return rank

    # -- exit status ----------------------------------------------------------------------------
    def _on_status(self, data: bytes) -> None:
        self._status_text += data

    def _on_status_eof(self) -> None:
        # The init closed its lifeline end: it has exited (or is exiting). Reap it.
        self.exit_time = time.time()
        try:
            _, status = os.waitpid(self.pid, 0)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = None if sig is not None else os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            sig, code = None, None
        words = self._status_text.decode(errors="replace").split()
        if len(words) >= 2 and words[0] == "exited":
            self._exit = ExitStatus(code=int(words[1]))
        elif len(words) >= 2 and words[0] == "signaled":
            self._exit = ExitStatus(signal=int(words[1]))
        else:
            self._exit = ExitStatus(code=code, signal=sig)
        self.cgroup.remove()
        with _REAPING_LOCK:
            if _REAPING.get(self.key) is self._exited:
                del _REAPING[self.key]
        self._exited.set()

    def poll(self) -> ExitStatus | None:
        return self._exit

    def wait(self, timeout: float | None = None) -> ExitStatus:
        if not self._exited.wait(timeout):
            raise MechanismError(f"rank {self.spec.name} still running after {timeout}s",
                                 hint="wait longer, or kill the rank")
        # The output pipe may still hold the last lines: wait until the pump has read it to the end.
        self._out_closed.wait(10)
        assert self._exit is not None
        return self._exit

    @property
    def running(self) -> bool:
        return self._exit is None

    def pids(self) -> list[int]:
        return tasks.descendants(self.pid) if self.running else []

    def command_gone(self) -> bool:
        """The init still runs, but nothing else of the rank does: its command ended and the init has not
        (yet) seen it. Read from /proc only: a lazily restored rank's memory is not touched."""
        if not self.running or not tasks.alive(self.pid):
            return False
        return not any(tasks.alive(p) for p in tasks.descendants(self.pid)[1:])

    def nudge(self) -> None:
        """Wake the init as its command's end would (it then reaps and reports)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCHLD)

    # -- checkpoint steps ---------------------------------------------------------------------------
    def _check_running(self, what: str) -> None:
        if not self.running or not tasks.alive(self.pid):
            raise RankExited(f"cannot {what} rank {self.spec.name}: it has exited ({self._exit or 'gone'})",
                             hint="its log says why it exited")

    def settle(self, timeout: float | None = 60.0) -> None:
        """Wait until a lazily restored rank has all its memory (at once for any other rank)."""
        pager = self._pager
        if pager is None:
            return
        try:
            code = pager.wait(timeout)
        except subprocess.TimeoutExpired:
            raise MechanismError(f"rank {self.spec.name}: its memory was not all restored after {timeout:.0f}s",
                                 hint="criu lazy-pages is still filling it in") from None
        self._pager = None
        # Also when the rank has already died: it may have crashed on the pages it lacked, and that is why.
        if code != 0 and not self._killed:
            raise MechanismError(f"rank {self.spec.name}: criu lazy-pages, which restored its memory, exited "
                                 f"with code {code}", hint="the rank may have lost memory: restore it again")

    def freeze(self) -> None:
        self._check_running("freeze")
        self.settle()  # CRIU cannot dump memory that is still being filled in
        self.cgroup.freeze()
        self._frozen = True
        pump().drain(self._out_r)

    def thaw(self) -> None:
        if self._frozen:
            self.cgroup.thaw()
            self._frozen = False

    def image_estimate(self) -> int:
        return tasks.rss_bytes(self.pids())

    def log_bytes(self) -> int:
        return self.node.log_path(self.spec).stat().st_size

    def dump(self, images: Path, runner: CriuRunner, ghost_limit: int) -> RankDump:
        """Dump the (frozen) rank into ``images``; it stays frozen."""
        self._check_running("checkpoint")
        if not self._frozen:
            raise MechanismError("dump needs a frozen rank", hint="call freeze() first")
        out_pipe, status_pipe = self.pipe_keys()
        private_dir(images)
        for attempt in range(3):
            try:
                runner.dump(self.pid, images, freezer=self.cgroup.path, ghost_limit=ghost_limit)
                break
            except TransientDumpError:
                if attempt == 2:
                    raise
                # Let the exiting task finish, then freeze again.
                self.cgroup.thaw()
                time.sleep(0.05)
                self.cgroup.freeze()
                for f in images.iterdir():
                    f.unlink()
        # CRIU thaws the cgroup for a moment while it seizes the tasks, and puts pipe contents back only
        # into pipes it creates itself: what was written meanwhile must be in the log before the offset.
        pump().drain(self._out_r)
        ctl_in, ctl_out = self.ctl_pipe_keys()
        if self.channel is not None:
            pump().drain(self.channel.rfd)  # a hello still in the pipe would not survive the restore
        interposed = self.channel is not None and self.channel.hello.is_set()
        return RankDump(self.spec.rank, images, self.log_bytes(), out_pipe, status_pipe, ctl_in, ctl_out,
                        interposed)

    def pipe_keys(self) -> tuple[str, str]:
        """CRIU's names ("pipe:[inode]") of the rank's output and status pipes, for --inherit-fd."""
        return tasks.fd_target(self.pid, 1), self._status_pipe_key()

    def ctl_pipe_keys(self) -> tuple[str | None, str | None]:
        """The same for the interposer channel (a pipe has one inode for both ends)."""
        if self.channel is None:
            return None, None
        return self.channel.keys

    def _status_pipe_key(self) -> str:
        mine = os.fstat(self._status_r).st_ino
        key = f"pipe:[{mine}]"
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            if tasks.fd_target(self.pid, int(fd)) == key:
                return key
        raise MechanismError(f"rank {self.spec.name}: its init no longer holds the status pipe",
                             hint="the rank's init is gone or was replaced: it cannot be checkpointed; kill it")

    def kill(self, timeout: float = 10.0, wait: bool = True) -> None:
        """SIGKILL the whole rank (also when frozen). ``wait``: until its init is reaped; else return at
        once: the tasks can run no more of their code, and the kernel frees their memory (a few tenths of a
        second per GB) while the job is restored elsewhere. A new incarnation on this node waits for it."""
        if not self.running:
            return
        self._killed = True
        if not wait:  # before the signal: it may be reaped at once
            with _REAPING_LOCK:
                _REAPING[self.key] = self._exited
        # A frozen rank (killed right after its dump) must not run another instruction: with only its init
        # signalled, the thaw below would let its other tasks run on until the kernel tears the namespace
        # down, past the state just dumped. A DataLoader worker then finished creating a shared-memory file
        # the checkpoint holds open by name (torch unlinks it right after creating it), and the restore
        # failed ("Can't open file dev/shm/torch_..."). Every task gets SIGKILL while frozen (a frozen task
        # cannot fork): thawed, it dies before returning to its code. In the host's PID namespace the init
        # outlives its tree: it reaps it, reports, then exits.
        if self.spec.pidns:
            victims = tasks.descendants(self.pid) if self._frozen else [self.pid]
        else:
            victims = tasks.descendants(self.pid)[1:] or [self.pid]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pager = self._pager
        if pager is not None:  # nothing left to fill in
            pager.kill()
            pager.wait()
        # A frozen task handles SIGKILL only once thawed.
        if self._frozen:
            self.cgroup.thaw()
            self._frozen = False
        if not wait:
            return
        deadline = time.monotonic() + timeout
        if not self._exited.wait(max(0.0, deadline - time.monotonic())):
            raise MechanismError(f"rank {self.spec.name} (pid {self.pid}) did not die within {timeout:.0f}s",
                                 hint=f"it may be stuck in the kernel: see /proc/{self.pid}/stack")


# Ranks killed without waiting, by rank key (node/rank), until reaped: the next incarnation of the same rank
# on the same node shares the cgroup path and must not take it before the old one has left (and removed) it.
_REAPING: dict[str, threading.Event] = {}
_REAPING_LOCK = threading.Lock()


def _await_predecessor(key: str, timeout: float = 30.0) -> None:
    with _REAPING_LOCK:
        gone = _REAPING.get(key)
    if gone is not None and not gone.wait(timeout):
        raise MechanismError(f"the previous incarnation of rank {key} did not die within {timeout:.0f}s",
                             hint="a process of it is stuck in uninterruptible sleep")
