"""What every route shares: the control plane's database and settings, handed to routes as a dependency
(``ctx: Ctx``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from tidal.control.regionstores import RegionStores
from tidal.control.retention import Rules
from tidal.control.store.db import Database
from tidal.policy.admission import Quotas
from tidal.policy.sla_admission import SlaMode


@dataclass
class Context:
    db: Database
    home: Path
    keep: int = 3
    lease_s: float = 5.0
    quotas: Quotas | None = None  # premium and standard are admitted against these
    # Admission against the load of guaranteed jobs that give their run time (TIDAL_ADMIT_SLA).
    admit_sla: SlaMode = "off"
    # The checkpoint store of each region, told to an agent at registration (`tidal server --store`); a
    # region without one: each agent's own setting (TIDAL_CHECKPOINT_STORE, else its TIDAL_HOME/checkpoints).
    stores: RegionStores = field(default_factory=RegionStores)
    # The SHA-256 fingerprint agents pin the server's certificate by (`tidal server --tls auto`: its CA's),
    # shown with a new join token; None without TLS, or with the operator's own certificate.
    fingerprint: str | None = None
    # Checkpoint retention (keep per job, finished jobs' time, store quotas): `tidal store usage` shows quotas.
    retention: Rules = field(default_factory=Rules)
    # `tidal server --metrics-public`: GET /metrics without a token.
    metrics_public: bool = False


async def context(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


Ctx = Annotated[Context, Depends(context)]
