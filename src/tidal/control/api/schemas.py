"""Request and response bodies of the API.

Every field is bounded (see :mod:`tidal.core.limits`): a request over a bound is a 422 naming the field,
never an allocation without end. A job's specification is checked by :class:`tidal.core.JobSpec`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from tidal.core import limits

# The agents' request bodies are the protocol's messages (one of another protocol version is a 426).
from tidal.core.protocol import ActionResult as ActionResult
from tidal.core.protocol import ExitReport as ExitReport
from tidal.core.protocol import Heartbeat as Heartbeat
from tidal.core.protocol import Leave
from tidal.core.protocol import RankExit as RankExit
from tidal.core.protocol import Register as Register

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Names of nodes, regions, clusters and agents: they end up in paths and log lines.
NodeName = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_NODE_NAME_CHARS)]
Ident = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_ID_CHARS)]
# A Unix account name (POSIX portable, plus the '$' of machine accounts).
UnixName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?$",
                                            max_length=limits.MAX_ID_CHARS)]


class JobSubmit(BaseModel):
    # Checked, bounds included, by JobSpec: its messages name the field and the bound.
    command: list[str]
    workdir: str
    name: str | None = None
    tier: str = "basic"
    ranks: int = 1
    min_devices: int | None = None
    max_devices: int | None = None
    env: dict[str, str] = Field(default_factory=dict)
    checkpoint_every: float | None = None
    max_restarts: int = 3
    project: str = "default"


class MigrateRequest(BaseModel):
    to: NodeName | None = None
    rank: int | None = None  # move only this rank (to ``to``)


class ResizeRequest(BaseModel):
    devices: int | None = None  # None: give D back to the scheduler (--auto)


class ResumeRequest(BaseModel):
    # ``from`` is a Python keyword: the attribute is ``from_``, the JSON field ``from``.
    from_: str | None = Field(default=None, alias="from")  # the checkpoint to resume from (default: newest)


class UserCreate(BaseModel):
    name: Ident
    role: str = Field(default="user", max_length=16)
    unix_user: UnixName | None = None


AgentHello = Leave
