"""Images fetched to this node ahead of a restore here (a migration's target), kept until that restore.

As a migration starts, the control plane has the target node fetch the job's last checkpoint while the job
is checkpointed where it runs. The restore that follows here (the next attempt of the job) waits for a
prestage still under way, takes what it fetched, and fetches only the chunks that changed since.

Anything else drops the images: an unstage order, a newer prestage of the job, a restore of an attempt that
does not follow the prestaged one, the end of the agent's lease, and a time limit (the control plane may
never say). So what is staged here stays bounded: one checkpoint's images per job, for ``ttl`` seconds at
most, and only ever handed to the restore of the same job that directly follows the prestaged attempt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping

from tidal.errors import Conflict
from tidal.mechanisms.criu.lastdump import LastDump

log = logging.getLogger(__name__)


def _drop(ranks: Mapping[int, LastDump]) -> None:
    for last in ranks.values():
        last.drop()


class _Staged:
    """One job's prestage: expected (its order is queued), under way, then its ranks' images until taken or
    dropped. ``done`` is set once it is over either way."""

    def __init__(self, attempt: int, checkpoint: str) -> None:
        self.attempt = attempt
        self.checkpoint = checkpoint
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._ranks: dict[int, LastDump] = {}
        self._dropped = False

    def finish(self, ranks: dict[int, LastDump]) -> bool:
        """The fetch is over; False if the prestage was dropped meanwhile (its images are then dropped too)."""
        with self._lock:
            kept = not self._dropped
            if kept:
                self._ranks = ranks
        if not kept:
            _drop(ranks)
        self.done.set()
        return kept

    def drop(self) -> None:
        with self._lock:
            self._dropped = True
            ranks, self._ranks = self._ranks, {}
        _drop(ranks)
        self.done.set()  # a restore waiting for it goes on without it

    def take(self, wanted: Collection[int]) -> dict[int, LastDump]:
        """The images of the ``wanted`` ranks; the others' are dropped. Once only."""
        with self._lock:
            self._dropped = True
            ranks, self._ranks = self._ranks, {}
        _drop({r: last for r, last in ranks.items() if r not in wanted})
        return {r: last for r, last in ranks.items() if r in wanted}


class Prestages:
    """The prestages of this node, one per job at most. ``ttl``: seconds a finished prestage is kept untaken;
    also how long a restore waits for one under way."""

    def __init__(self, ttl: float = 600.0) -> None:
        self.ttl = ttl
        self._mu = threading.Lock()
        self._jobs: dict[str, _Staged] = {}

    def expect(self, job_id: str, attempt: int, checkpoint: str) -> None:
        """A prestage of the job is queued here (replacing an older one): a restore from now on waits for it,
        even one whose order comes before the prestage has begun."""
        entry = _Staged(attempt, checkpoint)
        with self._mu:
            old, self._jobs[job_id] = self._jobs.get(job_id), entry
        if old is not None:
            old.drop()

    def fetch(self, job_id: str, attempt: int, checkpoint: str, fetch: Callable[[], dict[int, LastDump]]) -> None:
        """Run ``fetch`` as the job's prestage (expected, or replacing an older one): its images are kept here
        for the restore of attempt ``attempt + 1``. A :class:`Conflict` if it was dropped or replaced since
        it was expected."""
        with self._mu:
            entry = self._jobs.get(job_id)
            if entry is None or entry.attempt != attempt or entry.checkpoint != checkpoint or entry.done.is_set():
                entry = None
        if entry is None:
            raise Conflict(f"the prestage of job {job_id}'s checkpoint {checkpoint} was dropped or replaced "
                           "before it began", job=job_id, hint="nothing to do: a restore fetches what it needs")
        try:
            ranks = fetch()
        except BaseException:
            entry.drop()
            self._forget(job_id, entry)
            raise
        if entry.finish(ranks):
            self._expire_later(job_id, entry)

    def put(self, job_id: str, attempt: int, checkpoint: str, ranks: dict[int, LastDump]) -> None:
        """Images this node already has of the job's ``checkpoint`` (its own dump, kept for the restore of
        attempt ``attempt + 1`` here), taken as a finished prestage would be; any other prestage of the job
        is dropped (these are the very images of the checkpoint its restore comes from)."""
        entry = _Staged(attempt, checkpoint)
        with self._mu:
            old, self._jobs[job_id] = self._jobs.get(job_id), entry
        if old is not None:
            old.drop()
        if entry.finish(ranks):
            self._expire_later(job_id, entry)

    def take(self, job_id: str, attempt: int, ranks: Collection[int]) -> tuple[str, dict[int, LastDump]] | None:
        """For the restore of ``ranks`` of the job's attempt ``attempt`` here: the checkpoint prestaged for it
        and the images of those ranks (waiting for a prestage under way), or None. A prestage of another
        attempt is dropped: its checkpoint need not be what this restore's descends from."""
        with self._mu:
            entry = self._jobs.get(job_id)
        if entry is None:
            return None
        if entry.attempt + 1 != attempt:
            log.info("job %s: images prestaged for attempt %d dropped: this restore is attempt %d", job_id,
                     entry.attempt + 1, attempt)
            self._forget(job_id, entry)
            entry.drop()
            return None
        if not entry.done.wait(self.ttl):
            log.warning("job %s: its prestage is still under way after %.0fs; restoring without it", job_id, self.ttl)
            entry.drop()
        self._forget(job_id, entry)
        taken = entry.take(ranks)
        return (entry.checkpoint, taken) if taken else None

    def drop(self, job_id: str, attempt: int | None = None) -> bool:
        """Drop the job's prestage (only one for ``attempt`` or earlier, if given); whether there was one."""
        with self._mu:
            entry = self._jobs.get(job_id)
            if entry is None or (attempt is not None and entry.attempt > attempt):
                return False
            del self._jobs[job_id]
        entry.drop()
        return True

    def drop_all(self) -> None:
        with self._mu:
            entries, self._jobs = list(self._jobs.values()), {}
        for entry in entries:
            entry.drop()

    def _forget(self, job_id: str, entry: _Staged) -> None:
        with self._mu:
            if self._jobs.get(job_id) is entry:
                del self._jobs[job_id]

    def _expire_later(self, job_id: str, entry: _Staged) -> None:
        timer = threading.Timer(self.ttl, self._expire, args=(job_id, entry))
        timer.daemon = True
        timer.start()

    def _expire(self, job_id: str, entry: _Staged) -> None:
        with self._mu:
            mine = self._jobs.get(job_id) is entry
            if mine:
                del self._jobs[job_id]
        if mine:
            log.info("job %s: images prestaged from checkpoint %s dropped: no restore took them in %.0fs", job_id,
                     entry.checkpoint, self.ttl)
            entry.drop()
