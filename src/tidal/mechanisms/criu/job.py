"""A job's ranks on this machine, and the checkpoint protocol over them.

Checkpoint: freeze every rank → drain their output → CRIU-dump each (they stay frozen) → capture the
working directory's changes → then either thaw at once (periodic checkpoint: the store commit runs while
the job goes on) or commit and kill (preempt, migrate). A checkpoint exists only once its manifest is
committed; if anything fails before that, the ranks are thawed and go on as if nothing happened.

A resize or a move to another node root of this machine need not wait for the commit: :meth:`Job.checkpoint_local`
kills the ranks once dumped and commits in the background while :meth:`Job.restore` (``local=``) starts them
again from the images dumped here. The dump is the job's checkpoint only once committed: if that commit
fails, the restored job goes on and its latest committed checkpoint stays the one to fall back to.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from tidal.core.cutplan import Need, Plan, Report
from tidal.errors import CheckpointError, MechanismError, RankExited, TidalError, Unsupported, ValidationError
from tidal.mechanisms.criu import resources, shmfiles, tmpfiles
from tidal.mechanisms.criu.discard import discard
from tidal.mechanisms.criu.fsstate import FsSnapshot, FsTracker
from tidal.mechanisms.criu.images import page_file_windows, window_boundaries
from tidal.mechanisms.criu.lastdump import LastDump
from tidal.mechanisms.criu.prehash import PreHash
from tidal.mechanisms.criu.priority import in_background, yield_cpu
from tidal.mechanisms.criu.rank import ExitStatus, NodeRoot, RankDump, RankProcess, RankSpec
from tidal.mechanisms.criu.runner import CriuRunner
from tidal.mechanisms.criu.warmup import Warmup
from tidal.mechanisms.gpu.devicestate import DeviceState, remap_for
from tidal.mechanisms.interpose.channel import (
    RankChannel,
    Store,
    cut,
    new_epoch,
    park,
    park_round,
    rebuilt,
    report,
    resume,
    teardown,
    wake,
)
from tidal.mechanisms.permissions import private_dir
from tidal.mechanisms.storage import CheckpointInfo, CheckpointReader, CheckpointStore, CheckpointWriter, Entry

FORMAT = 1
log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
# After the commit: the job goes on, is killed, or stays frozen until release() or kill() (a job spread
# over several nodes is committed only once every node has stored its part).
Then = Literal["continue", "kill", "hold"]
#: How long the commit of a checkpoint the job goes on from waits for its ranks to have rebuilt their group.
REBUILD_WAIT_S = 10.0


@dataclass(frozen=True)
class RestoreTiming:
    """Where the time of one restore went (seconds)."""

    fetch_s: float  # images fetched from the store and verified
    fs_s: float  # working directory and logs put back
    criu_s: float
    total_s: float
    image_bytes: int = 0  # the restored ranks' images
    fetched_bytes: int = 0  # of them, fetched from the store (the rest: from pre-staged images, or zeros)


@dataclass(frozen=True)
class CheckpointTiming:
    """Where the time of one checkpoint went (seconds)."""

    pause_s: float  # the ranks were frozen this long
    dump_s: float
    fs_s: float
    commit_s: float
    total_s: float


def _copy_prefix(src: Path, dest: Path, length: int) -> None:
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        os.fchmod(fo.fileno(), 0o600)
        left, off = length, 0
        while left:
            n = os.sendfile(fo.fileno(), fi.fileno(), off, left)  # in-kernel, also across file systems
            off += n
            if n == 0:
                raise CheckpointError(f"log {src} is shorter than {length} bytes", object=str(src),
                                      hint="the rank's log must not be truncated while the job lives")
            left -= n


def _remove_staging(staging: Path) -> None:
    discard(staging, parent_too=True)  # and the node's staging area, once nothing of it is left


# A commit's outcome: the checkpoint, each rank's image entries, each rank's page-file windows.
_Committed = tuple[CheckpointInfo, dict[int, dict[str, Entry]], dict[int, dict[str, dict[int, int]]]]


class _LocalReader:
    """What :meth:`Job.restore` reads of a :class:`LocalDump` besides its images: the meta, logs and files."""

    fetched_bytes = 0

    @dataclass(frozen=True)
    class _Info:
        id: str

    def __init__(self, dump: LocalDump) -> None:
        self.dump = dump
        self.meta = dump.meta
        self.info = self._Info(dump.id)

    def _source(self, name: str) -> Path:
        if name.startswith("fs/"):
            return self.dump.staging / name
        rank, what = name.removeprefix("ranks/").split("/", 1)
        if what.startswith("shm/"):
            return self.dump.staging / f"shm-{rank}" / what.removeprefix("shm/")
        if what.startswith("tmp/"):
            return self.dump.staging / f"tmp-{rank}" / what.removeprefix("tmp/")
        assert what == "output.log", name
        return self.dump.log(int(rank))

    def extract(self, name: str, dest: Path) -> None:
        self.extract_all([(name, dest)])

    def extract_all(self, pairs: Sequence[tuple[str, Path]]) -> None:
        """Copy the files (temp file + rename, as a store's reader does)."""
        for name, dest in pairs:
            src = self._source(name)
            tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
            try:
                _copy_prefix(src, tmp, src.stat().st_size)
                tmp.rename(dest)
            finally:
                tmp.unlink(missing_ok=True)


def _each(items: Sequence[T], work: Callable[[T], R], done: list[R] | None = None) -> list[R]:
    """``work`` on every item, several at a time where the machine has the cores (each is mostly a CRIU
    process of its own: a rank's dump or restore), results in the items' order. Every call ends before this
    returns; the first failure is raised then. ``done`` gets every result, also those that succeeded before a
    failure, for the caller to undo."""
    done = [] if done is None else done
    if len(items) < 2 or (os.cpu_count() or 1) < 2:
        start = len(done)
        for item in items:
            done.append(work(item))
        return done[start:]
    with ThreadPoolExecutor(max_workers=min(len(items), os.cpu_count() or 1),
                            thread_name_prefix="tidal-rank") as pool:
        futures = [pool.submit(work, item) for item in items]
        wait(futures)
    done.extend(f.result() for f in futures if f.exception() is None)
    return [f.result() for f in futures]  # the first failure is raised here, as it was raised


class LocalDump:
    """A job dumped on this machine by :meth:`Job.checkpoint_local`, being committed to the store in the
    background. :meth:`Job.restore` (``local=``) starts its ranks from these images at once, here; the
    commit goes on meanwhile. Until :attr:`info` is set the dump is no checkpoint of the job: whatever must
    fall back (a restore elsewhere, later, after a crash) uses the job's latest committed one, which a failed
    commit leaves as it was. The staging area stays until :meth:`close` (its restore closes it)."""

    def __init__(self, job_id: str, checkpoint_id: str, meta: dict[str, Any], staging: Path,
                 images: dict[int, Path]) -> None:
        self.job_id = job_id
        self.id = checkpoint_id
        self.meta = meta  # as committed
        self.staging = staging
        self.images = images  # rank → its images directory
        self.created_at = time.time()
        # The images' size, for what is told before the commit has counted everything it stores, and for its
        # restore's figures (read once: a restore may take the images over as its job's last dump).
        self.nbytes = sum(f.stat().st_size for d in images.values() for f in d.iterdir() if f.suffix == ".img")
        self.info: CheckpointInfo | None = None  # once committed
        self.error: BaseException | None = None  # why the commit failed
        self.entries: dict[int, dict[str, Entry]] = {}
        self.windows: dict[int, dict[str, dict[int, int]]] = {}
        self.commit_s = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._mu = threading.Lock()

    def commit_in_background(self, commit: Callable[[], _Committed],
                             on_commit: Callable[[LocalDump], None] | None) -> None:
        def run() -> None:
            yield_cpu()  # the restore from these images is what the job waits for, not this
            t0 = time.perf_counter()
            try:
                self.info, self.entries, self.windows = commit()
            except BaseException as e:  # reported; the restored job goes on
                self.error = e
                log.error("job %s: checkpoint %s was not committed, the job goes on from its dump here; its "
                          "latest committed checkpoint stays the one to fall back to: %s", self.job_id, self.id, e)
            finally:
                self.commit_s = time.perf_counter() - t0
            if on_commit is not None:
                try:
                    on_commit(self)
                except Exception:
                    log.exception("job %s: reporting the commit of checkpoint %s failed", self.job_id, self.id)

        self._thread = threading.Thread(target=run, name=f"tidal-commit-{self.job_id}", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> CheckpointInfo:
        """The committed checkpoint, once its commit has ended; :class:`CheckpointError` if it failed."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise CheckpointError(f"checkpoint {self.id} of job {self.job_id} is still being committed",
                                      object=self.id, hint="wait longer")
        if self.info is None:
            raise CheckpointError(f"checkpoint {self.id} of job {self.job_id} was not committed: {self.error}",
                                  object=self.id, hint="the job's latest committed checkpoint is its fallback")
        return self.info

    def log(self, rank: int) -> Path:
        return self.staging / f"rank-{rank}.log"

    def close(self) -> None:
        """Once the commit has ended, remove what is left of the staging area (in the background)."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
        if self._thread is not None:
            self._thread.join()
        _remove_staging(self.staging)


class Job:
    """The ranks of one job placed on nodes of this machine."""

    def __init__(self, job_id: str, ranks: Sequence[RankProcess], fs: FsTracker | None, store: CheckpointStore,
                 runner: CriuRunner | None = None, ghost_limit: int = 256 << 20, compare_last: bool = False,
                 devices: DeviceState | None = None) -> None:
        """``fs``: the working directory's tracker, on the one node that saves and restores it (None on
        the job's other nodes: they share the directory). ``compare_last``: the next commit compares the
        new images with the last dump's instead of hashing them all; by default the last dump is removed
        right before the next one, which is then written into its memory (see
        :mod:`~tidal.mechanisms.criu.lastdump`). On the reference VM that made a 1.25 GiB rank's pause
        0.39–0.50 s instead of 0.94–2.8 s, for 0.3–0.5 s more commit after the job went on."""
        self.job_id = job_id
        self.ranks = list(ranks)
        self.fs = fs
        self.store = store
        self.runner = runner or CriuRunner()
        self.ghost_limit = ghost_limit
        self.devices = devices or DeviceState()  # GPU state; nothing to do for CPU ranks
        self.last_timing: CheckpointTiming | None = None
        self.restore_timing: RestoreTiming | None = None
        self._last: dict[int, LastDump] = {r.spec.rank: LastDump() for r in self.ranks}
        self.compare_last = compare_last
        self.cut_timeout = 30.0  # how long ranks get to reach the consistent cut
        self.last_cut: int | None = None  # the collective count at which the last checkpoint cut the job
        self._held: tuple[list[RankProcess], int] | None = None  # frozen after a "hold" checkpoint
        # The newest park round asked for, (epoch, version): an older one still running gives way to it.
        self._round = (-1, -1)
        self._round_lock = threading.Lock()
        self._held_gpu: dict[int, list[int]] = {}  # rank → its processes whose GPU state is in host memory
        self._settling: threading.Thread | None = None  # after a restore, until the ranks' memory is all in
        self._kept: dict[int, LastDump] = {}  # images kept by checkpoint(keep_images=True), until taken

    def _after_restore(self, staging: Path, kept: dict[int, tuple[Path, dict[str, Entry]]],
                       local: LocalDump | None = None) -> None:
        """Once every restored rank has all its memory: keep its images for the next checkpoint and drop
        the restore's staging area. A rank whose memory could not all be filled in is killed: it would
        otherwise go on with pages of zeros. ``local``: the dump restored from, kept too once committed (a
        next checkpoint waits for that commit)."""
        try:
            for r in self.ranks:
                try:
                    r.settle(None)
                except MechanismError as e:
                    log.error("job %s: %s; killing the job: %s", self.job_id, e.message, e.hint)
                    for rp in self.ranks:
                        with contextlib.suppress(Exception):
                            rp.kill(wait=False)
            if all(r.running for r in self.ranks):
                for rank, (images, entries) in kept.items():
                    self._last[rank].keep(images, entries, staging.parent / f"{self.job_id}-last-r{rank}")
            if local is not None:
                with contextlib.suppress(CheckpointError):
                    local.wait()  # a failure was reported by its commit
                if local.info is not None and all(r.running for r in self.ranks):
                    for rank, images in local.images.items():
                        self._keep_last(rank, images, local.entries[rank], local.windows[rank])
        finally:
            _remove_staging(staging)
            if local is not None:
                local.close()

    def _await_restored(self) -> None:
        if self._settling is not None:
            self._settling.join()
            self._settling = None

    def channels(self) -> list[RankChannel]:
        return [r.channel for r in self.ranks if r.channel is not None]

    @classmethod
    def launch(cls, job_id: str, placement: Sequence[tuple[RankSpec, NodeRoot]], store: CheckpointStore,
               track_fs: bool = True, fs_ignore: frozenset[str] = frozenset(), **kw: Any) -> Job:
        """``fs_ignore``: files of the working directory that are not the job's state (see
        :class:`FsTracker`)."""
        if not placement:
            raise MechanismError("a job needs at least one rank", hint="place at least one rank on a node")
        workdir = placement[0][0].workdir
        if not workdir.is_dir():
            raise MechanismError(f"working directory {workdir} does not exist",
                                 hint="it must exist at the same path on every node")
        fs = FsTracker.at_launch(workdir, placement[0][0].account, fs_ignore) if track_fs else None
        ranks: list[RankProcess] = []
        try:
            for spec, node in placement:
                ranks.append(RankProcess.launch(spec, node))
        except BaseException:
            for r in ranks:
                r.kill()
            raise
        return cls(job_id, ranks, fs, store, **kw)

    # -- state ------------------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> list[ExitStatus]:
        deadline = None if timeout is None else time.monotonic() + timeout
        done = [r.wait(None if deadline is None else max(0.0, deadline - time.monotonic())) for r in self.ranks]
        self._await_restored()
        self._drop_last()
        return done

    def kill(self, wait: bool = True) -> None:
        """SIGKILL every rank; ``wait``: until each is reaped (see :meth:`RankProcess.kill`)."""
        self._held = None
        for r in self.ranks:
            r.kill(wait=wait)
        self._await_restored()
        self._drop_last()

    def _drop_last(self) -> None:
        for last in self._last.values():
            last.drop()

    def _keep_last(self, rank: int, images: Path, entries: dict[str, Entry],
                   windows: dict[str, dict[int, int]]) -> None:
        self._last[rank].keep(images, entries, images.parent.parent / f"{self.job_id}-last-r{rank}",
                              large_pages=True, windows=windows)  # a dump's staging; restored images: small

    # -- checkpoint -------------------------------------------------------------------------------------
    # A cut across nodes is driven from outside, step by step (each step on every node before the next):
    # report → park(plan) in rounds until no rank needs more → checkpoint(cut_at=...) → release() or kill().
    # Until released, the ranks wait at their next op; except after a checkpoint that lets the job continue:
    # its ranks go on once dumped. (park(target), to collective ``target`` of the world group, is what a
    # control plane of an older release asks for.)
    def report(self, epoch: int) -> Report:
        """Step 1 over every communicator: per communicator, the most ops a rank here announced, and its
        members; :meth:`Plan.from_counts` over every node's ``comms`` gives the first targets."""
        self._held = ([], epoch)
        return report(self.channels(), epoch, self.cut_timeout)

    def park(self, epoch: int, target: int | Plan) -> list[Need]:
        """Let the ranks here run up to collective ``target`` of the world group and wait for it to complete.
        With a :class:`Plan` (one round over every communicator): up to its targets; returns the needs its
        ranks raised beyond them (raise them with :meth:`Plan.raise_for` and park every node again, at the
        new version), or [] once every rank here has parked. A round superseded meanwhile by a newer one
        (:meth:`supersede`) returns [] at once: its answer no longer counts."""
        self._held = ([], epoch)
        if not isinstance(target, Plan):
            park(self.channels(), epoch, target, self.cut_timeout)
            return []
        with self._round_lock:
            # Versions order the rounds of one cut only: epochs are random, and a new epoch is a new cut.
            if self._round[0] == epoch and target.version < self._round[1]:
                return []  # a round that came after it already ran
            self._round = (epoch, target.version)
        got = park_round(self.channels(), epoch, target, self.cut_timeout,
                         lambda: self._round != (epoch, target.version))
        return got or []

    def supersede(self, epoch: int, version: int) -> None:
        """A park round at ``version`` is on its way: a running round of an older version ends now."""
        with self._round_lock:
            if self._round[0] == epoch and version <= self._round[1]:
                return
            self._round = (epoch, version)
        wake()

    def checkpoint(self, then: Then = "continue", keep: int | None = None, *, checkpoint_id: str | None = None,
                   cut_at: tuple[int, int] | None = None, rendezvous: Store | None = None,
                   keep_images: bool = False, warm: bool = False) -> CheckpointInfo:
        """Take a checkpoint of every rank; ``then`` says whether the job continues, is killed or stays
        frozen after the commit. ``keep``: retain only the newest ``keep`` committed checkpoints. ``warm``
        (with ``then="kill"`` and the cut made here): where no last dump is there to write into, first make
        the dump's memory ready while the ranks run on (:mod:`.warmup`): a shorter standstill, a later cut.
        ``cut_at``: (epoch, target) of a cut parked across nodes by :meth:`report` and
        :meth:`park` (``target``: the world group's, only recorded as :attr:`last_cut`); the
        ranks then wait for :meth:`release` whatever happens (a thawed rank runs until its next
        collective). Else the cut is made here. ``rendezvous``: where the ranks rebuild their group when
        they go on (default: the same store). ``keep_images`` (with ``then="kill"``): keep the images
        dumped here, as committed, for a restore on this machine (:meth:`take_images`), which then fetches
        nothing from the store."""
        if keep_images and then != "kill":
            raise ValidationError("keep_images is for a checkpoint that kills the job", field="keep_images",
                                  hint="a job that goes on keeps its last dump by itself")
        info = self._checkpoint(then, keep, checkpoint_id, cut_at, rendezvous, local=False, keep_images=keep_images,
                                warm=warm)
        assert isinstance(info, CheckpointInfo)
        return info

    def take_images(self) -> dict[int, LastDump]:
        """The images of the last ``checkpoint(then="kill", keep_images=True)``, rank → its committed images,
        for :meth:`restore` (``prestaged=``); the caller drops what it does not use. Once only."""
        kept, self._kept = self._kept, {}
        return kept

    def checkpoint_local(self, keep: int | None = None, *, checkpoint_id: str | None = None,
                         on_commit: Callable[[LocalDump], None] | None = None) -> LocalDump:
        """Checkpoint every rank and kill the job, for a restore on this machine (a resize, a move to
        another node root here): the ranks are killed once dumped, and the commit to the store runs in the
        background while :meth:`restore` (``local=``) starts the ranks again from the images dumped here.
        ``on_commit``: called with the result once the commit has ended, committed or failed (a failure is
        also logged). Until it is committed the new checkpoint is no checkpoint of the job: if its commit
        fails, the job's latest committed checkpoint stays the one to fall back to."""
        dump = self._checkpoint("kill", keep, checkpoint_id, None, None, local=True, on_commit=on_commit)
        assert isinstance(dump, LocalDump)
        return dump

    def _checkpoint(self, then: Then, keep: int | None, checkpoint_id: str | None, cut_at: tuple[int, int] | None,
                    rendezvous: Store | None, *, local: bool, keep_images: bool = False, warm: bool = False,
                    on_commit: Callable[[LocalDump], None] | None = None) -> CheckpointInfo | LocalDump:
        if then not in ("continue", "kill", "hold"):
            raise ValidationError(f"then must be 'continue', 'kill' or 'hold', not {then!r}", field="then",
                                  hint="continue: the job goes on; kill: it stops; hold: it stays frozen")
        node = self.ranks[0].node
        self._await_restored()
        need = sum(r.image_estimate() for r in self.ranks)
        freeing: list[LastDump] = []
        if not self.compare_last:
            for last in self._last.values():
                # Its pages are then the ones CRIU's new images go into (freed while the cut is made, which
                # the ranks run on through). Small pages (restored images) would take tenths of a second to
                # free, and are of little use to a large-page dump: they go in the background.
                if last.large_pages and last.dir is not None:
                    freeing.append(last)
                else:
                    last.drop()

        def free() -> None:
            for last in freeing:
                last.drop(now=True)

        dropping = threading.Thread(target=free, daemon=True, name=f"tidal-drop-{self.job_id}") if freeing else None
        if dropping is not None:
            dropping.start()
        name = f"{self.job_id}-{uuid.uuid4().hex[:8]}"
        staging: Path | None = None
        warmup = None
        if warm and then == "kill" and cut_at is None and not freeing and need:
            # Nothing to write into, and the job stops: its memory is made ready while the ranks run on,
            # before the cut, so that the dump (the job's standstill) does not wait for fresh pages.
            staging = node.staging(name, need)
            warmup = Warmup(staging, need) if node.in_memory(staging) else None
        t0 = time.perf_counter()
        # Bring torch.distributed to a consistent cut first (ranks without it have nothing to cut). It
        # leaves every rank as it was if it fails.
        channels = self.channels()
        let_go = cut_at is None
        try:
            if cut_at is None:
                epoch = new_epoch()
                self.last_cut = cut(channels, epoch, self.cut_timeout)
            else:
                epoch, self.last_cut = cut_at
                self._held = ([], epoch)
                teardown(channels, epoch, self.cut_timeout)
        except BaseException:
            if staging is not None:
                _remove_staging(staging)
            raise
        finally:
            if dropping is not None:
                dropping.join()  # the staging area below counts on the memory it frees
        if staging is None:
            staging = node.staging(name, need)
        frozen: list[RankProcess] = []
        suspended: dict[int, list[int]] = {}
        gpus: dict[int, list[str]] = {}
        writer = None
        released = False
        prehash: PreHash | None = None
        handed: LocalDump | None = None  # the dump, handed over for a restore here while it is committed
        try:
            self._refuse_unsupported()
            # GPU state moves to host memory while the processes still run (the driver needs them to).
            for r in self.ranks:
                done = self.devices.suspend(r.spec.name, r.pids())
                if done:
                    suspended[r.spec.rank] = done
                    gpus[r.spec.rank] = self.devices.gpus(r.spec.env)
            for r in self.ranks:
                r.freeze()
                frozen.append(r)
            # Again, frozen: what a rank opened since the first look would make CRIU fail with a far less
            # clear error (thawed at once below, the job goes on).
            self._refuse_unsupported()
            if warmup is not None:
                warmup.release()
            # CRIU dumps on one core; the chunks it has written are hashed on another meanwhile.
            prehash = PreHash(staging, self.store.chunk_size, background=then == "continue" or local)
            dumps = _each(self.ranks, lambda r: r.dump(staging / f"rank-{r.spec.rank}", self.runner,
                                                        self.ghost_limit))
            t_dump = time.perf_counter()
            snap = self.fs.capture(staging / "fs") if self.fs is not None else None
            # Files of /dev/shm the ranks hold by name: CRIU reopens them by name at restore.
            shm = {r.spec.rank: shmfiles.capture(r.pids(), staging / f"shm-{r.spec.rank}") for r in self.ranks}
            # And those of its temporary directory (a compiler's cache): absent on another machine.
            tmp = {r.spec.rank: tmpfiles.capture(r.pids(), r.spec.env, (r.spec.workdir, r.node.root),
                                                 staging / f"tmp-{r.spec.rank}") for r in self.ranks}
            for r, d in zip(self.ranks, dumps, strict=True):
                _copy_prefix(r.node.log_path(r.spec), staging / f"rank-{r.spec.rank}.log", d.log_bytes)
            t_fs = time.perf_counter()
            if then == "continue":
                self._thaw(frozen)
                released = True
                self._resume_devices(suspended)
                if let_go:
                    resume(channels, epoch, rendezvous, wait=False)
                else:
                    # A cut across nodes: the ranks dumped here go on at once, rebuilding their group, which the
                    # other nodes' ranks join once dumped in turn; neither the commit below nor the slowest node's
                    # is part of their pause. A later release() finds nothing held.
                    self._held = None
                    resume(channels, epoch, rendezvous, wait=False, rebuild=True)
            t_pause = time.perf_counter()
            if released:
                # The ranks rebuild their group before the commit competes with them; over several nodes that is
                # once the other nodes have dumped theirs too, so this node's commit does not slow their dumps.
                # Bounded: another node whose dump failed lets its ranks rebuild only at the finish, which waits
                # for this node's answer.
                rebuilt(channels, epoch, REBUILD_WAIT_S)
            writer = self.store.writer(self.job_id, checkpoint_id)
            meta = self._meta(dumps, snap, gpus, shm, tmp)
            if local:
                # The commit compares with the last dump still: it takes it over, and drops it once done.
                lasts, self._last = self._last, {rank: LastDump() for rank in self._last}
                handed = LocalDump(self.job_id, writer.id, meta, staging, {d.rank: d.images for d in dumps})
                handed.commit_in_background(
                    self._committer(writer, prehash, dumps, snap, shm, tmp, staging, meta, keep, lasts), on_commit)
                writer = None
                t_commit = time.perf_counter()
            else:
                commit = self._committer(writer, prehash, dumps, snap, shm, tmp, staging, meta, None)
                # The job runs on: its commit yields the cores to the job and to its dumps on other nodes here.
                info, entries, windows_of = in_background(commit) if released else commit()
                writer = None
                t_commit = time.perf_counter()
                if then == "continue" or keep_images:
                    for d in dumps:
                        self._keep_last(d.rank, d.images, entries[d.rank], windows_of[d.rank])
                if keep_images:  # handed over before the kill below drops the job's last dumps
                    self._kept, self._last = self._last, {rank: LastDump() for rank in self._last}
        except BaseException as exc:
            if prehash is not None:
                prehash.stop()
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.abort()
            if not released:
                self._thaw(frozen)
                with contextlib.suppress(Exception):
                    self._resume_devices(suspended)
                if let_go:
                    with contextlib.suppress(Exception):
                        resume(channels, epoch, rendezvous, wait=False)
            if isinstance(exc, CheckpointError | RankExited | Unsupported):
                raise
            if isinstance(exc, TidalError):
                raise CheckpointError(f"checkpoint of job {self.job_id} failed: {exc.message}",
                                      hint="the job goes on; its last good checkpoint is untouched",
                                      **exc.fields) from exc
            if isinstance(exc, OSError):
                raise CheckpointError(f"checkpoint of job {self.job_id} failed: {exc}",
                                      hint="the job goes on; its last good checkpoint is untouched") from exc
            raise
        finally:
            if handed is None:
                _remove_staging(staging)
        if then == "kill":
            # The checkpoint is committed: the job's downtime need not include the kernel freeing the
            # ranks' memory; except for ranks in the host's PID namespace, whose PIDs their restore needs.
            self.kill(wait=not all(r.spec.pidns for r in self.ranks))
            t_pause = time.perf_counter()
        elif then == "hold":
            self._held = (frozen, epoch)
            self._held_gpu = suspended
            t_pause = time.perf_counter()
        self.last_timing = CheckpointTiming(
            pause_s=t_pause - t0, dump_s=t_dump - t0, fs_s=t_fs - t_dump,
            commit_s=t_commit - (t_pause if then == "continue" else t_fs), total_s=time.perf_counter() - t0)
        if handed is not None:
            return handed  # retention follows its commit
        if keep is not None:
            self.store.retain(self.job_id, keep)
        return info

    def _refuse_unsupported(self) -> None:
        """:class:`Unsupported` naming what the ranks hold that CRIU cannot dump (a socket, io_uring)."""
        blocked = resources.unsupported([p for r in self.ranks for p in r.pids()])
        if blocked:
            raise Unsupported(f"job {self.job_id} cannot be checkpointed: {resources.describe(blocked)}",
                              hint=blocked[0][3])

    def _committer(self, writer: CheckpointWriter, prehash: PreHash, dumps: list[RankDump], snap: FsSnapshot | None,
                   shm: dict[int, list[shmfiles.ShmFile]], tmp: dict[int, list[tmpfiles.TmpFile]], staging: Path,
                   meta: dict[str, Any], keep: int | None,
                   lasts: dict[int, LastDump] | None = None) -> Callable[[], _Committed]:
        """The commit of a dump staged in ``staging``: what the job's last dump has of it is compared, the
        rest hashed and stored, then the manifest put. ``keep``: retention after it. ``lasts``: the last
        dumps to compare with, taken over from the job (dropped after the commit); default: the job's."""
        last_of = self._last if lasts is None else lasts

        def commit() -> _Committed:
            try:
                hashed = prehash.stop()
                entries: dict[int, dict[str, Entry]] = {}
                windows_of: dict[int, dict[str, dict[int, int]]] = {}
                for d in dumps:
                    windows = windows_of[d.rank] = page_file_windows(d.images)
                    last = last_of[d.rank]
                    entries[d.rank] = {
                        f.name: writer.add_file(
                            f"ranks/{d.rank}/images/{f.name}", f,
                            boundaries=window_boundaries(windows.get(f.name, {})), previous=last.previous(f.name),
                            previous_offsets=last.moved(f.name, windows.get(f.name, {})), digests=hashed.get(f))
                        for f in sorted(d.images.iterdir()) if f.suffix == ".img"
                    }
                    writer.add_file(f"ranks/{d.rank}/output.log", staging / f"rank-{d.rank}.log")
                    for f in shm[d.rank]:
                        writer.add_file(f"ranks/{d.rank}/shm/{f.name}", staging / f"shm-{d.rank}" / f.name)
                    for i, _ in enumerate(tmp[d.rank]):
                        writer.add_file(f"ranks/{d.rank}/tmp/{i}", staging / f"tmp-{d.rank}" / str(i))
                for path in snap.captured if snap else ():
                    writer.add_file(f"fs/{path}", staging / "fs" / path)
                info = writer.commit(meta)
            except BaseException:
                with contextlib.suppress(Exception):
                    writer.abort()
                raise
            finally:
                for last in (lasts or {}).values():
                    last.drop()
            if keep is not None:
                self.store.retain(self.job_id, keep)
            return info, entries, windows_of

        return commit

    def release(self, rendezvous: Store | None = None, rebuild: bool = False) -> None:
        """Let ranks waiting after a step of a cut across nodes go on: thaw those held frozen, rebuild
        the process groups (``rebuild``: also where not dropped: every rank of the job must be on the
        new one) and open the gate."""
        if self._held is None:
            return
        frozen, epoch = self._held
        self._held = None
        self._thaw(frozen)
        held_gpu, self._held_gpu = self._held_gpu, {}
        self._resume_devices(held_gpu)
        resume(self.channels(), epoch, rendezvous, wait=False, rebuild=rebuild)

    def _resume_devices(self, suspended: dict[int, list[int]]) -> None:
        """Put the GPU state of the processes :meth:`DeviceState.suspend` took back onto their GPUs."""
        for r in self.ranks:
            if r.spec.rank in suspended:
                self.devices.resume(r.spec.name, suspended[r.spec.rank])

    def _thaw(self, ranks: list[RankProcess]) -> None:
        for r in ranks:
            with contextlib.suppress(Exception):
                r.thaw()
        ranks.clear()

    def pre_dump(self) -> None:
        """Iterative pre-copy of every rank's memory; :class:`Unsupported` where the kernel can't track it."""
        node = self.ranks[0].node
        for r in self.ranks:
            staging = node.staging(f"{self.job_id}-pre-{r.spec.rank}")
            try:
                self.runner.pre_dump(r.pid, staging)
            finally:
                _remove_staging(staging)  # nothing reuses pre-dump images yet

    def _meta(self, dumps: list[RankDump], snap: FsSnapshot | None, gpus: Mapping[int, list[str]],
              shm: dict[int, list[shmfiles.ShmFile]], tmp: dict[int, list[tmpfiles.TmpFile]]) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "job_id": self.job_id,
            "workdir": str(self.ranks[0].spec.workdir),
            "ranks": {
                str(d.rank): {
                    "log_bytes": d.log_bytes, "out_pipe": d.out_pipe, "status_pipe": d.status_pipe,
                    "ctl_in_pipe": d.ctl_in_pipe, "ctl_out_pipe": d.ctl_out_pipe, "interposed": d.interposed,
                    "argv": list(r.spec.argv), "node": r.node.name,
                    "gpus": gpus.get(d.rank, []),  # the GPUs whose state the images hold, by UUID
                    "shm": [f.to_json() for f in shm.get(d.rank, [])],
                    "tmp": [f.to_json() for f in tmp.get(d.rank, [])],
                }
                for r, d in zip(self.ranks, dumps, strict=True)
            },
            "fs": snap.to_json() if snap else None,  # this part carries the working directory
            "baseline": self.fs.baseline_json() if self.fs else None,
        }

    # -- restore ----------------------------------------------------------------------------------------
    @staticmethod
    def _reader(store: CheckpointStore, job_id: str, checkpoint_id: str | None) -> CheckpointReader:
        if checkpoint_id is None:
            latest = store.latest(job_id)
            if latest is None:
                raise CheckpointError(f"job {job_id} has no committed checkpoint", object=job_id,
                                      hint="launch the job anew instead of restoring it")
            checkpoint_id = latest.id
        return store.reader(job_id, checkpoint_id)

    @classmethod
    def prestage(cls, store: CheckpointStore, job_id: str, placement: Sequence[tuple[RankSpec | int, NodeRoot]],
                 checkpoint_id: str | Sequence[str] | None = None) -> dict[int, LastDump]:
        """Pre-copy for a planned move: fetch and verify the images of a committed checkpoint (default: the
        latest), or of its parts (one per node it was spread over), on the target nodes while the job still
        runs. A restore given the result then fetches only the chunks that changed since, so the job is
        stopped for less time. ``placement``: each rank (its spec, or its number) and its node. A rank with
        nothing kept (memory short) is left out of the result."""
        parts: list[str | None] = [checkpoint_id] if checkpoint_id is None or isinstance(checkpoint_id, str) \
            else list(checkpoint_id)
        owner: dict[int, CheckpointReader] = {}
        for p in parts:
            part = cls._reader(store, job_id, p)
            owner.update({int(r): part for r in part.meta.get("ranks", {})})
        staged: dict[int, LastDump] = {}
        try:
            for spec, node in placement:
                rank = spec if isinstance(spec, int) else spec.rank
                found = owner.get(rank)
                if found is None:
                    raise CheckpointError(f"checkpoint {', '.join(map(str, parts))} of job {job_id} holds no rank "
                                          f"{rank}", object=str(parts[0]),
                                          hint="pre-stage the ranks the checkpoint holds")
                reader = found
                prefix = f"ranks/{rank}/images/"
                names = [n for n in reader.names() if n.startswith(prefix)]
                need = sum(reader.entry(n).size for n in names)
                d = node.staging(f"{job_id}-prestage-{uuid.uuid4().hex[:8]}", need, fetched=True)
                last = LastDump()
                try:
                    reader.extract_all([(n, d / n[len(prefix):]) for n in names])
                    last.keep(d, {n[len(prefix):]: reader.entry(n) for n in names},
                              d.parent / f"{job_id}-prestaged-r{rank}")
                finally:
                    if last.dir is None:
                        _remove_staging(d)  # not taken over (failed, or memory short): nothing may stay
                if last.dir is not None:
                    staged[rank] = last
        except BaseException:
            for last in staged.values():
                last.drop()
            raise
        return staged

    @classmethod
    def restore(cls, store: CheckpointStore, job_id: str, placement: Sequence[tuple[RankSpec, NodeRoot]],
                checkpoint_id: str | Sequence[str] | None = None, prestaged: Mapping[int, LastDump] | None = None,
                rendezvous: Store | None = None, track_fs: bool = True, lazy: bool = True,
                fs_ignore: frozenset[str] = frozenset(), local: LocalDump | None = None, **kw: Any) -> Job:
        """Restore the ranks of ``placement`` from ``checkpoint_id`` (default: the latest committed one),
        or from its parts (one per node it was spread over; the placement may take any of their ranks).
        ``prestaged``: what :meth:`prestage` fetched on these nodes earlier (consumed here).
        ``rendezvous``: where the ranks rebuild their torch.distributed group (default: where it was).
        ``track_fs``: this node puts the working directory back (exactly one node of a job does).
        ``lazy``: the ranks resume before their memory is all in; it is filled in from the verified images
        as they touch it and in the background (see :meth:`CriuRunner.restore`), which takes most of CRIU's
        restore out of the downtime. Where the kernel lacks what it needs (``tidal doctor``: "criu: lazy
        pages"), the restore is eager. ``fs_ignore``: as for :meth:`launch`. ``local``: restore from the
        images of :meth:`checkpoint_local` on this machine instead of a checkpoint in the store, while it is
        being committed (consumed here: closed once the ranks no longer need its images; once committed,
        they are kept for the next checkpoint as a restore's own are)."""
        # One checkpoint (or the latest): every rank must be placed. Parts: any of their ranks.
        whole = checkpoint_id is None or isinstance(checkpoint_id, str)
        parts: list[str | None] = [checkpoint_id] if checkpoint_id is None or isinstance(checkpoint_id, str) \
            else list(checkpoint_id)
        if local is not None and (checkpoint_id not in (None, local.id) or prestaged):
            raise ValidationError("a restore from a local dump takes neither another checkpoint nor prestaged "
                                  "images", field="local", hint="give only local=")
        readers: list[CheckpointReader | _LocalReader] = [_LocalReader(local)] if local is not None \
            else [cls._reader(store, job_id, p) for p in parts]
        owner: dict[int, CheckpointReader | _LocalReader] = {}
        fs_reader: CheckpointReader | _LocalReader | None = None
        for reader in readers:
            meta = reader.meta
            if meta.get("format") != FORMAT:
                raise CheckpointError(f"checkpoint {reader.info.id} has unknown format {meta.get('format')!r}",
                                      object=reader.info.id, hint="restore it with the Tidal version that took it")
            owner.update({int(r): reader for r in meta["ranks"]})
            if meta.get("fs") is not None:
                fs_reader = reader
        by_rank = {spec.rank: (spec, node) for spec, node in placement}
        missing = sorted(set(by_rank) - set(owner))
        if missing or (whole and sorted(by_rank) != sorted(owner)):
            raise CheckpointError(f"checkpoint {', '.join(r.info.id for r in readers)} holds ranks "
                                  f"{sorted(owner)}, placement gives {sorted(by_rank)}", object=readers[0].info.id,
                                  hint="place every rank the checkpoint holds, and no other")
        workdir = Path(readers[0].meta["workdir"])
        if not workdir.is_dir():
            raise CheckpointError(f"cannot restore job {job_id}: working directory {workdir} does not exist "
                                  "on this node", object=str(workdir),
                                  hint="the working directory must exist at the same path on every node")
        fs = None
        if track_fs:
            if fs_reader is None:
                raise CheckpointError(f"no part of checkpoint {readers[0].info.id} carries the working directory",
                                      object=readers[0].info.id,
                                      hint="restore it without tracking the working directory (track_fs=False)")
            fs = FsTracker.from_json(workdir, fs_reader.meta["baseline"], placement[0][0].account, fs_ignore)
        node0 = placement[0][1]
        mine = {r: owner[r] for r in by_rank}
        need = sum(rd.entry(n).size for r, rd in mine.items() if isinstance(rd, CheckpointReader) for n in rd.names()
                   if n.startswith(f"ranks/{r}/images/"))
        staging = node0.staging(f"{job_id}-restore-{uuid.uuid4().hex[:8]}", need, fetched=True)
        ranks: list[RankProcess] = []
        job: Job | None = None
        t0 = time.perf_counter()
        try:
            # Fetch and verify every image before touching the working directory or any log.
            for r, reader in sorted(mine.items()):
                if not isinstance(reader, CheckpointReader):
                    continue  # its images are here already
                pairs = [(n, staging / n) for n in reader.names() if n.startswith(f"ranks/{r}/images/")]
                bases = {}
                staged = (prestaged or {}).get(r)
                for name, dest in pairs:
                    private_dir(dest.parent)
                    base = staged.previous(dest.name) if staged else None
                    if base is not None:
                        bases[name] = base
                # The pre-staged images are this restore's alone: patched into the new ones in place.
                reader.extract_all(pairs, bases=bases, consume_bases=True)
            t_fetch = time.perf_counter()
            fetched = sum(rd.fetched_bytes for rd in readers)
            if fs is not None and fs_reader is not None:
                snap = FsSnapshot.from_json(fs_reader.meta["fs"])
                src = fs_reader

                def fetch(paths: list[str], into: Path) -> None:
                    items = [(f"fs/{p}", into / p) for p in paths]
                    for _, dest in items:
                        private_dir(dest.parent)
                    src.extract_all(items)

                fs.restore(snap, fetch, staging / "fs")
            for r, reader in mine.items():
                spec, node = by_rank[r]
                reader.extract(f"ranks/{r}/output.log", node.log_path(spec))
                # Before CRIU runs: it opens them by name (a rank may have removed one since the dump).
                shm = [shmfiles.ShmFile.from_json(f) for f in reader.meta["ranks"][str(r)].get("shm", [])]
                if shm:
                    into = private_dir(staging / "shm" / str(r))
                    reader.extract_all([(f"ranks/{r}/shm/{f.name}", into / f.name) for f in shm])
                    shmfiles.put_back([(f, into / f.name) for f in shm], spec.account)
                held = [tmpfiles.TmpFile.from_json(f) for f in reader.meta["ranks"][str(r)].get("tmp", [])]
                if held:
                    into = private_dir(staging / "tmp" / str(r))
                    reader.extract_all([(f"ranks/{r}/tmp/{i}", into / str(i)) for i, _ in enumerate(held)])
                    tmpfiles.put_back([(f, into / str(i)) for i, f in enumerate(held)], spec.env, spec.account)
            t_fs = time.perf_counter()
            runner = kw.get("runner") or CriuRunner()
            lazy = lazy and runner.supports("uffd-noncoop")  # a tree that forks needs non-cooperative events
            # The driver copies a GPU rank's device memory back from host memory at once: lazily restored
            # pages would only be faulted in one by one.
            on_gpu = {r: list(reader.meta["ranks"][str(r)].get("gpus") or []) for r, reader in mine.items()}
            lazy = lazy and not any(on_gpu.values())
            def restore_rank(r: int) -> RankProcess:
                spec, node = by_rank[r]
                info = mine[r].meta["ranks"][str(r)]
                images = local.images[r] if local is not None else staging / "ranks" / str(r) / "images"
                dump = RankDump(r, images, int(info["log_bytes"]),
                                info["out_pipe"], info["status_pipe"], info.get("ctl_in_pipe"),
                                info.get("ctl_out_pipe"), bool(info.get("interposed")))
                return RankProcess.restore(spec, node, dump, runner, lazy=lazy)

            _each(sorted(mine), restore_rank, done=ranks)
            job = cls(job_id, ranks, fs, store, **kw)
            for rp in ranks:
                old_gpus = on_gpu[rp.spec.rank]
                if old_gpus:
                    remap = remap_for(old_gpus, job.devices.gpus(rp.spec.env))
                    if not job.devices.resume(rp.spec.name, rp.pids(), remap):
                        raise CheckpointError(f"rank {rp.spec.name} was checkpointed with GPU state, but none of "
                                              "its restored processes waits for it", object=job_id,
                                              hint="the checkpoint does not match this Tidal's restore")
            # The verified images just restored are exactly the committed ones: the next checkpoint of
            # this job can compare against them, or write into their memory. A lazily restored rank reads
            # them until its memory is all in.
            # A local dump's images are kept once committed (see _after_restore).
            kept = {}
            for r, reader in mine.items():
                if isinstance(reader, CheckpointReader):
                    names = [n for n in reader.names() if n.startswith(f"ranks/{r}/images/")]
                    kept[r] = (staging / "ranks" / str(r) / "images",
                               {n.rsplit("/", 1)[1]: reader.entry(n) for n in names})
            job._settling = threading.Thread(target=job._after_restore, args=(staging, kept, local),
                                             name=f"tidal-settle-{job_id}")
            job._settling.start()
        except BaseException:
            for rp in ranks:
                with contextlib.suppress(Exception):
                    rp.kill()
            if job is None:
                _remove_staging(staging)
            if local is not None and (job is None or job._settling is None):
                # Its commit goes on; the images go once it has ended.
                threading.Thread(target=local.close, name=f"tidal-close-{job_id}", daemon=True).start()
            raise
        finally:
            for last in (prestaged or {}).values():
                last.drop()
        # The ranks were dumped at a cut, waiting: let them rebuild their group and go on.
        resume(job.channels(), new_epoch(), rendezvous, wait=False)
        end = time.perf_counter()
        if local is not None:
            need = local.nbytes
        job.restore_timing = RestoreTiming(t_fetch - t0, t_fs - t_fetch, end - t_fs, end - t0, need, fetched)
        return job
