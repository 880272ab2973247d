"""``GET /metrics``: the control plane's Prometheus metrics (docs/metrics.md). A scrape takes a token of role
``metrics`` (made for the scraper: ``POST /v1/users {"name": "prometheus", "role": "metrics"}``) or ``admin``:
the metrics name every job and node, whoever owns them. ``tidal server --metrics-public`` serves them without
a token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool

from tidal.control.api.auth import principal
from tidal.control.api.context import Ctx
from tidal.errors import Forbidden

router = APIRouter()

SCRAPERS = ("metrics", "admin")


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> Response:
    if not ctx.metrics_public:
        p = await principal(request, ctx, authorization)
        if p.role not in SCRAPERS:
            raise Forbidden("reading the metrics needs a token of role metrics or admin",
                            hint='an admin makes one: POST /v1/users {"name": "prometheus", "role": "metrics"}')
    registry: CollectorRegistry = request.app.state.metrics
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    # The collector reads the database (and folds new events): off the event loop.
    body = await run_in_threadpool(encoder, registry)
    return Response(body, media_type=content_type)
