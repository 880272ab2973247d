"""Collecting unreferenced chunks while other machines write checkpoints: sweep markers and watermarks.

No lock reaches from one machine to another through an object store, so garbage collection (a *sweep*) and
checkpoint writers on other hosts fence each other with objects and the times the store gives them:

* A writer first puts ``jobs/J/C/pending/start``: its start, in the store's clock. Until its manifest is put
  it is *live* (while some object under ``pending/`` is younger than the writer lease).
* A sweep puts ``sweeps/<id>.json`` (running, with the deadline it stops deleting at) before it looks at
  anything, and rewrites it as ended after its last delete.
* **Chunks a writer uploads** are spared by the watermark: a sweep deletes only chunks last written before
  the oldest live writer started (and before the sweep itself started), less ``grace`` seconds for clocks.
  A writer that starts after the sweep looked started after the sweep did.
* **Chunks a writer found already there** (a dedup hit, or the chunks of the job's newest checkpoint) may be
  old and unreferenced at that moment: a sweep could delete one between the writer's look and the pending
  refs that name it. So before its manifest goes in, a writer looks for sweeps that overlapped it (running,
  or ended after its start); for each, it waits until the sweep ended (or its deadline passed), then checks
  that every chunk it relies on without having written it is still there and writes again those that are
  not. A sweep that starts after that reads the writer's pending refs, which name all of them.

Ended markers are removed once they are older than every live writer's start.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backends import Backend

SWEEPS = "sweeps"
START = "start"  # under a checkpoint's pending/: the writer's start marker
#: Store timestamps may be whole seconds: an ended marker this close to a writer's start counts as overlapping.
GRANULARITY = 1.0


@dataclass(frozen=True)
class Marker:
    key: str
    until: float  # the sweep's deadline (the sweeper's clock)
    ended: bool
    modified: float  # when the marker was last written (the store's clock)


class Sweep:
    """One sweep's marker: put running on entry, rewritten as ended on exit. :meth:`may_delete` is false
    once the deadline is near: a writer waiting on this sweep stops waiting at the deadline."""

    def __init__(self, backend: Backend, limit: float) -> None:
        self.backend = backend
        self.until = time.time() + limit
        self.key = f"{SWEEPS}/{time.time_ns():020d}-{secrets.token_hex(4)}.json"

    def _put(self, ended: bool) -> None:
        self.backend.put(self.key, json.dumps({"until": self.until, "ended": ended}).encode())

    def __enter__(self) -> Sweep:
        self._put(ended=False)
        return self

    def __exit__(self, *exc: object) -> None:
        self._put(ended=True)

    def may_delete(self) -> bool:
        return time.time() < self.until - 2 * GRANULARITY


def markers(backend: Backend) -> Iterator[Marker]:
    """The sweep markers in the store (a damaged one reads as running until now: waited on briefly)."""
    for name in backend.listdir(SWEEPS):
        key = f"{SWEEPS}/{name}"
        modified = backend.modified(key)
        if modified is None:
            continue  # pruned meanwhile
        try:
            body = json.loads(backend.get(key))
            until, ended = float(body["until"]), bool(body["ended"])
        except FileNotFoundError:
            continue
        except (ValueError, TypeError, KeyError):
            until, ended = time.time(), False
        yield Marker(key, until, ended, modified)


def overlapping(backend: Backend, since: float) -> list[Marker]:
    """Sweeps that may have deleted chunks after ``since`` (a store time): running, or ended after it."""
    return [m for m in markers(backend) if not m.ended or m.modified >= since - GRANULARITY]


def wait_out(backend: Backend, sweeps: list[Marker], poll: float = 0.2) -> None:
    """Wait until each of ``sweeps`` has ended or passed its deadline."""
    pending = {m.key for m in sweeps if not m.ended}
    deadline = max((m.until for m in sweeps if not m.ended), default=0.0)
    while pending and time.time() < deadline:
        now = {m.key: m for m in markers(backend)}
        pending = {k for k in pending if k in now and not now[k].ended and now[k].until > time.time()}
        if pending:
            time.sleep(poll)


def prune(backend: Backend, before: float, own: str) -> None:
    """Remove ended markers last written before ``before`` (a store time no live writer started before), and
    running ones whose deadline passed before it (a sweeper that died)."""
    for m in markers(backend):
        if m.key != own and ((m.ended and m.modified < before - GRANULARITY) or m.until < before - 60):
            with contextlib.suppress(FileNotFoundError):
                backend.delete(m.key)
