"""Request and response bodies of the API.

Every field is bounded (see :mod:`tidal.core.limits`): a request over a bound is a 422 naming the field,
never an allocation without end. A job's specification is checked by :class:`tidal.core.JobSpec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, create_model

from tidal.core import JobSpec

# The agents' request bodies are the protocol's messages (one of another protocol version is a 426).
from tidal.core.protocol import ActionResult as ActionResult
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


class _Submission(BaseModel):
    """A job's submission. Its fields are :class:`tidal.core.JobSpec`'s, made by :func:`_submission_model`;
    each is checked, bounds included, by JobSpec: its messages name the field and the bound."""

    def to_spec(self, owner: str) -> JobSpec:
        return JobSpec.submitted(dict(self), owner=owner)


def _submission_model() -> type[_Submission]:
    fields: dict[str, Any] = {}
    for f in JobSpec.submission_fields():
        if f.required:
            fields[f.name] = (f.type, ...)
        elif f.default_factory is not None:
            fields[f.name] = (f.type, Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (f.type, f.default)
    return create_model("JobSubmit", __base__=_Submission, __module__=__name__, **fields)


if TYPE_CHECKING:
    JobSubmit = _Submission
else:
    JobSubmit = _submission_model()


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


class JoinTokenCreate(BaseModel):
    node: NodeName
    ttl: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # seconds; None: the default (24 h)


AgentHello = Leave
