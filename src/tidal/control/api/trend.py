"""The cluster's figures over time, for the dashboard's charts: utilisation, goodput and SLA attainment per
tier, sampled every :data:`EVERY_S` by this process while it serves (and at each dashboard request that finds
the last sample old), the last :data:`KEEP` samples kept in memory. The long history is Prometheus's: these
are the same figures as GET /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from tidal.control.api.context import Context
from tidal.control.api.overview import overview
from tidal.errors import TidalError

log = logging.getLogger(__name__)

EVERY_S = 10.0
KEEP = 360  # an hour


class Trend:
    def __init__(self, every_s: float = EVERY_S, keep: int = KEEP) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._samples: deque[dict[str, Any]] = deque(maxlen=keep)

    def offer(self, figures: dict[str, Any]) -> None:
        """Keep ``figures`` (what :func:`overview` gives) when the last sample is ``every_s`` old."""
        sample = {"time": figures["time"], "utilisation": figures["utilisation"], "goodput": figures["goodput"],
                  "sla": {t: v["attainment"] for t, v in figures["sla"].items()}}
        with self._lock:
            if not self._samples or sample["time"] - self._samples[-1]["time"] >= self.every_s * 0.9:
                self._samples.append(sample)

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples)

    async def run(self, ctx: Context) -> None:
        while True:
            try:
                self.offer(await run_in_threadpool(overview, ctx.db, None))
            except TidalError as exc:  # the database away a moment: the next sample will do
                log.debug("trend: %s", exc)
            except Exception:  # never the end of the sampling, nor of the app's shutdown
                log.exception("trend: sampling failed")
            await asyncio.sleep(self.every_s)


@contextlib.asynccontextmanager
async def sampling(app: FastAPI) -> AsyncIterator[None]:
    """The app's lifespan: the trend is sampled while the app serves."""
    task = asyncio.create_task(app.state.trend.run(app.state.ctx))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
