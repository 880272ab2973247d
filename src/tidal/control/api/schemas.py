"""Request and response bodies of the API.

Every field is bounded (see :mod:`tidal.core.limits`): a request over a bound is a 422 naming the field,
never an allocation without end. A job's specification is checked by :class:`tidal.core.JobSpec`; its
submission's body is :mod:`tidal.core.submission_body`'s.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from tidal.control.jobfilter import MAX_BULK, MAX_VALUES

# The agents' request bodies are the protocol's messages (one of another protocol version is a 426).
from tidal.core.protocol import ActionResult as ActionResult
from tidal.core.protocol import CommitReport as CommitReport
from tidal.core.protocol import ExitReport as ExitReport
from tidal.core.protocol import Heartbeat as Heartbeat

# Names of nodes, agents, users and Unix accounts: bounded and plain, as the protocol's.
from tidal.core.protocol import Ident as Ident
from tidal.core.protocol import Join as Join
from tidal.core.protocol import Leave
from tidal.core.protocol import NodeName as NodeName
from tidal.core.protocol import RankExit as RankExit
from tidal.core.protocol import Register as Register
from tidal.core.protocol import UnixName as UnixName

# A job's submission: JobSpec's fields, strict about its keys (the CLI checks a job file with it too).
from tidal.core.submission_body import JobSubmit as JobSubmit

#: Users or projects named in one request, at most.
MAX_LISTED = 1000


class MigrateRequest(BaseModel):
    to: NodeName | None = None
    rank: int | None = None  # move only this rank (to ``to``)
    region: Ident | None = None  # onto nodes of this region (not with ``to``)
    cluster: Ident | None = None  # onto nodes of this cluster


class ResizeRequest(BaseModel):
    devices: int | None = None  # None: give D back to the scheduler (--auto)


class ResumeRequest(BaseModel):
    # ``from`` is a Python keyword: the attribute is ``from_``, the JSON field ``from``.
    from_: str | None = Field(default=None, alias="from")  # the checkpoint to resume from (default: newest)


class UserCreate(BaseModel):
    name: Ident
    role: str = Field(default="user", max_length=16)
    unix_user: UnixName | None = None
    # A user-role account whose Unix account is root (uid 0) is refused without it.
    allow_root: bool = False
    projects: list[Ident] = Field(default_factory=list, max_length=MAX_LISTED)  # made a member of each


# A limit as an admin sets it: a number, "unlimited", or "default" (the override removed).
LimitValue = float | Annotated[str, StringConstraints(max_length=16)]


class UserLimits(BaseModel):
    """The limits to change (those left out stay as they are)."""

    model_config = ConfigDict(extra="forbid")
    rate: LimitValue | None = None
    burst: LimitValue | None = None
    max_queued: LimitValue | None = None
    max_devices: LimitValue | None = None


class ProjectLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_queued: LimitValue | None = None
    max_devices: LimitValue | None = None


class ProjectCreate(BaseModel):
    name: str = Field(max_length=256)  # its rule is checked by the control plane, which says what it is
    members: list[Ident] = Field(default_factory=list, max_length=MAX_LISTED)


class TokenCreate(BaseModel):
    label: str | None = Field(default=None, max_length=64)
    ttl: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # seconds; None: until revoked


class NodeDrain(BaseModel):
    reason: str | None = Field(default=None, max_length=200)  # why, as `tidal nodes` shows it


class JoinTokenCreate(BaseModel):
    node: NodeName
    ttl: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # seconds; None: the default (24 h)


AgentHello = Leave


class JobFilter(BaseModel):
    """Which jobs a bulk request selects, as ``GET /v1/jobs``'s query does (each list: values, or comma lists)."""

    model_config = ConfigDict(extra="forbid")
    state: list[str] | None = Field(default=None, max_length=MAX_VALUES)  # none: the jobs not yet ended
    user: list[str] | None = Field(default=None, max_length=MAX_VALUES)
    name: str | None = None  # a name, or a glob (* and ?)
    tier: list[str] | None = Field(default=None, max_length=MAX_VALUES)
    since: float | None = Field(default=None, allow_inf_nan=False)  # submitted at or after (Unix time)
    all: bool = False  # every user's (an admin)


JobId = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class BulkRequest(BaseModel):
    """``POST /v1/jobs/{cancel,preempt}``: the jobs given by ``ids``, or those ``filter`` selects (a page of them
    from ``cursor``: the answer's ``next_cursor`` where more are left)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[JobId] | None = Field(default=None, max_length=MAX_BULK)
    filter: JobFilter | None = None
    cursor: str | None = None
