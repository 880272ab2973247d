"""What each user and project uses of their limits, exported on ``GET /metrics``: jobs waiting and devices held
(read from the database at each scrape, one series per user and per project), and requests refused over a user's
rate (this process's count, since it started). The series are as many as the users and projects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import select

from tidal.control import userlimits
from tidal.control.api.ratelimit import Buckets
from tidal.control.store.db import Database
from tidal.control.store.models import Project, User


class UsageCollector(Collector):
    def __init__(self, db: Database, buckets: Buckets) -> None:
        self.db = db
        self.buckets = buckets

    def collect(self) -> Iterator[Any]:
        refused = CounterMetricFamily("tidal_user_requests_refused", "Requests of the user refused over their "
                                      "request rate (429), by this API process since it started.", labels=("user",))
        for user, n in sorted(dict(self.buckets.refused).items()):
            refused.add_metric([user], n)
        yield refused
        with self.db.read() as s:
            users, projects = userlimits.use_by(s)
            people = list(s.scalars(select(User.name).where(User.role.in_(("user", "admin"))).order_by(User.name)))
            names = list(s.scalars(select(Project.name).order_by(Project.name)))
        for kind, rows, use in (("user", people, users), ("project", names, projects)):
            queued = GaugeMetricFamily(f"tidal_{kind}_queued_jobs", f"Jobs of the {kind} waiting (pending, held or "
                                       "preempted): what its queued-jobs limit counts.", labels=(kind,))
            devices = GaugeMetricFamily(f"tidal_{kind}_devices_held", f"Devices held by the {kind}'s jobs.",
                                        labels=(kind,))
            for name in rows:
                u = use.get(name, userlimits.Use())
                queued.add_metric([name], u.queued)
                devices.add_metric([name], u.devices)
            yield queued
            yield devices
