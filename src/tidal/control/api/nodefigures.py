"""What agents report of their nodes themselves in their heartbeats (the bytes of checkpoint images staged in
memory and on disk), kept by this process as last reported and exported on ``GET /metrics``.

Gauges of the moment, not history: they are not written to the database at every heartbeat. After a restart of
the control plane they come back with the next heartbeat of each node; a node silent for :data:`STALE_S` is no
longer exported."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

STALE_S = 60.0
#: figure reported → (metric, the value of its label ``medium``)
STAGING = {"staging_memory_bytes": "memory", "staging_disk_bytes": "disk"}


class NodeFigures(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, dict[str, float]]] = {}

    def report(self, node: str, figures: Mapping[str, float]) -> None:
        with self._lock:
            self._last[node] = (time.monotonic(), dict(figures))

    def current(self) -> dict[str, dict[str, float]]:
        cutoff = time.monotonic() - STALE_S
        with self._lock:
            for node in [n for n, (t, _) in self._last.items() if t < cutoff]:
                del self._last[node]
            return {n: dict(f) for n, (_, f) in self._last.items()}

    def collect(self) -> Iterator[Any]:
        g = GaugeMetricFamily("tidal_node_staging_bytes", "Bytes of checkpoint images staged on the node, in "
                              "memory (/dev/shm) or on disk, as its agent last reported.", labels=("node", "medium"))
        for node, figures in sorted(self.current().items()):
            for key, medium in STAGING.items():
                if key in figures:
                    g.add_metric([node, medium], figures[key])
        yield g
