"""The measured link between two regions: how fast checkpoints cross from one region's store to another's.

A restore (or a pre-copy) in another region than its checkpoint's copies the chunks its region's store lacks
first, and its node reports the stored bytes that crossed and the seconds the copy took. Of those copies, the
ones of at least :data:`MIN_BYTES` are timed: a smaller one is mostly requests and existence checks, and says
little of the link's rate. Per pair of regions (from, to; a link may be faster one way than the other), the
last :data:`KEEP` timed copies are kept in the database (table ``region_links``), so that a restarted control
plane knows them.

The rate is the median of those copies' rates (bytes / seconds), not an exponentially weighted mean: one
copy that shared the link with another, or that a store's retries slowed, would pull a mean a long way for
several copies after it, and the median of the last five ignores up to two such copies outright while it
still follows a lasting change of the link within three copies; nor does it need a weight to be tuned.

The scheduler's estimate of a move's transfer between regions (:class:`tidal.core.Links`, ``pair_gbps``) takes
the measured rate of the pair where there is one; else ``TIDAL_REGION_GBPS``; else the 0.5 GB/s default.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control.clock import now
from tidal.control.store.models import RegionLinkRow
from tidal.core import Links

#: A copy is timed when at least this many stored bytes crossed.
MIN_BYTES = 64 << 20
#: How many of a pair's last timed copies its rate is the median of.
KEEP = 5


# -- the rate, from the copies (pure) ---------------------------------------------------------------------
def timed(nbytes: int, seconds: float) -> bool:
    """Whether a copy of ``nbytes`` stored bytes in ``seconds`` is large enough to say what the link does."""
    return nbytes >= MIN_BYTES and seconds > 0


def kept(samples: Sequence[Sequence[float]], nbytes: int, seconds: float) -> list[list[float]]:
    """The copies kept once a copy of ``nbytes`` in ``seconds`` is added (if timed): the last :data:`KEEP`,
    oldest first."""
    out = [[float(b), float(t)] for b, t in samples]
    if timed(nbytes, seconds):
        out.append([float(nbytes), float(seconds)])
    return out[-KEEP:]


def rate_gbps(samples: Sequence[Sequence[float]]) -> float | None:
    """The link's rate in GB/s (10⁹ bytes a second): the median of the copies' rates; None without one."""
    rates = [b / t / 1e9 for b, t in samples if t > 0]
    return statistics.median(rates) if rates else None


# -- in the control plane's transactions ------------------------------------------------------------------
def note(s: Session, source: str, target: str, nbytes: int, seconds: float) -> float | None:
    """A copy of ``nbytes`` stored bytes from region ``source``'s store to region ``target``'s took
    ``seconds``: kept if it is timed. The pair's rate now (None while none of its copies was timed)."""
    row = s.get(RegionLinkRow, (source, target))
    if source == target or not timed(nbytes, seconds):
        return rate_gbps(row.samples) if row is not None else None
    if row is None:
        row = RegionLinkRow(source=source, target=target, samples=[], copies=0, updated_at=now(s))
        s.add(row)
    row.samples = kept(row.samples or [], nbytes, seconds)
    row.copies = (row.copies or 0) + 1
    row.updated_at = now(s)
    return rate_gbps(row.samples)


def measured(s: Session) -> dict[tuple[str, str], float]:
    """The measured rate of each pair of regions that has one, GB/s, by (from, to)."""
    out = {}
    for row in s.scalars(select(RegionLinkRow)):
        rate = rate_gbps(row.samples or [])
        if rate is not None:
            out[(row.source, row.target)] = rate
    return out


def links(s: Session, base: Links) -> Links:
    """``base`` (the settings' rates) with the measured rate of each pair of regions that has one."""
    pairs = measured(s)
    return dataclasses.replace(base, pair_gbps={**base.pair_gbps, **pairs}) if pairs else base


def listing(s: Session) -> list[dict[str, Any]]:
    """Each measured link, as the API lists it: from, to, gbps (the median of the last copies), copies (timed in
    all), samples (how many the rate is the median of), measured_at (the last one's time)."""
    out = []
    for row in s.scalars(select(RegionLinkRow).order_by(RegionLinkRow.source, RegionLinkRow.target)):
        rate = rate_gbps(row.samples or [])
        if rate is not None:
            out.append({"from": row.source, "to": row.target, "gbps": round(rate, 4), "copies": row.copies,
                        "samples": len(row.samples), "measured_at": row.updated_at})
    return out
