"""The control plane's HTTP API. Users (and admins) manage jobs under /v1/jobs; agents talk to
/v1/agent/*. Every route authenticates with a bearer token; errors are JSON with a message (and the
offending ``field`` for bad input), never a traceback.

This module only wires the app: the routes are in :mod:`tidal.control.api.routes` by area, what they share
is a :class:`Context` (a dependency), who calls is :mod:`tidal.control.api.auth`'s, errors are answered by
:mod:`tidal.control.api.handlers`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, ProcessCollector

from tidal.control.api import auth, handlers, lanes, latency, trend
from tidal.control.api.bodylimit import BodyLimit
from tidal.control.api.context import Context
from tidal.control.api.nodefigures import NodeFigures
from tidal.control.api.ratelimit import Buckets, RateLimit
from tidal.control.api.routes import admin, agents, cluster, jobs, metrics, projects, service, store, stream, ui, users
from tidal.control.api.usagemetrics import UsageCollector
from tidal.control.metrics import TidalCollector
from tidal.core import limits

__all__ = ["Context", "create_app"]


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with lanes.lanes(app), trend.sampling(app):
        yield


def create_app(ctx: Context) -> FastAPI:
    app = FastAPI(title="Tidal control plane", version="1", lifespan=_lifespan)
    app.state.ctx = ctx
    app.state.trend = trend.Trend()  # the cluster's figures over time, for the dashboard
    app.state.principals = auth.Principals()  # who each token is, once looked up
    app.state.buckets = Buckets()  # each user's request rate
    app.state.streams = stream.Streams()  # event streams open
    # Log chunks from agents are larger than anything else a client sends.
    app.add_middleware(BodyLimit, limit=limits.MAX_BODY_BYTES,
                       routes=(("PUT", r"/v1/agent/[^/]+/logs/[^/]+/[^/]+", limits.MAX_LOG_UPLOAD_BYTES),))
    # What GET /metrics serves: the database's metrics, this process's and the API's request latency.
    app.state.metrics = registry = CollectorRegistry()
    registry.register(TidalCollector(ctx.db))
    app.state.node_figures = NodeFigures()  # what the agents' heartbeats say of their nodes
    registry.register(app.state.node_figures)
    registry.register(UsageCollector(ctx.db, app.state.buckets))
    ProcessCollector(registry=registry)
    # Before anything else is done of a request (its body read, its route's database work): its user's rate.
    app.add_middleware(RateLimit, principals=app.state.principals, buckets=app.state.buckets,
                       clock=lambda: auth.clock_of(ctx))
    app.add_middleware(latency.Latency, latency=latency.histogram(registry))
    handlers.install(app)
    # The agents' routes first: a request is matched against the routes in order, and theirs are most of the
    # requests of a large cluster (heartbeats, long-polls).
    for area in (agents, service, users, projects, jobs, cluster, store, stream, admin, metrics, ui):
        app.include_router(area.router)
    return app
