"""Request and response bodies of the API.

Every field is bounded (see :mod:`tidal.core.limits`): a request over a bound is a 422 naming the field,
never an allocation without end. A job's specification is checked by :class:`tidal.core.JobSpec`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StringConstraints, create_model, field_validator
from pydantic_core.core_schema import ValidationInfo

from tidal.core import JobSpec, limits
from tidal.errors import InvalidField

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Names of nodes, regions, clusters and agents: they end up in paths and log lines.
NodeName = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_NODE_NAME_CHARS)]
Ident = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_ID_CHARS)]
# A Unix account name (POSIX portable, plus the '$' of machine accounts).
UnixName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?$",
                                            max_length=limits.MAX_ID_CHARS)]
Rank = Annotated[int, Field(ge=0, lt=limits.MAX_RANKS)]
Int32 = Annotated[int, Field(ge=-(2**31), lt=2**31)]


def _printable(text: str | None) -> str | None:
    """An agent's error text as the database can store it: a lone surrogate (from an undecodable file
    name, say) is shown escaped rather than refusing the report the agent would otherwise retry."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode()


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


class Register(BaseModel):
    name: NodeName
    agent_id: Ident
    region: Ident = "local"
    cluster: Ident = "local"
    devices: int = Field(ge=1, le=limits.MAX_DEVICES_PER_NODE)
    cpus: list[list[int]]  # device index → its CPU set

    @field_validator("cpus")
    @classmethod
    def _one_cpu_set_per_device(cls, cpus: list[list[int]], info: ValidationInfo) -> list[list[int]]:
        devices = info.data.get("devices")
        if devices is not None and len(cpus) != devices:
            raise InvalidField(f"{len(cpus)} CPU sets for {devices} device(s): give one per device")
        for i, cs in enumerate(cpus):
            if not cs or len(set(cs)) != len(cs) or not all(0 <= c <= limits.MAX_CPU_ID for c in cs):
                raise InvalidField(f"device {i}: a CPU set is distinct CPU ids from 0 to {limits.MAX_CPU_ID}")
        return cpus


class AgentHello(BaseModel):
    agent_id: Ident


JobId = Annotated[str, StringConstraints(pattern=_NAME, max_length=32)]
Figure = Annotated[str, StringConstraints(max_length=limits.MAX_ID_CHARS)]


class Heartbeat(BaseModel):
    agent_id: Ident
    # job id → {"attempt", "cpu_s", "rss_bytes", "output_bytes", "steps", "collectives", ...} for the jobs
    # running on the node
    jobs: dict[JobId, Annotated[dict[Figure, float], Field(max_length=limits.MAX_PROGRESS_FIGURES)]] = Field(
        default_factory=dict, max_length=limits.MAX_HEARTBEAT_JOBS)

    @field_validator("jobs")
    @classmethod
    def _finite(cls, jobs: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        # A figure that is not a finite number (a rate over no time, say) is left out, not refused: a
        # refused heartbeat would cost the node its lease. JSON cannot carry it back to users anyway.
        return {j: {k: v for k, v in figures.items() if math.isfinite(v)} for j, figures in jobs.items()}


class ActionResult(BaseModel):
    agent_id: Ident
    action_id: Ident
    ok: bool
    error: Annotated[str | None, AfterValidator(_printable)] = None
    data: dict[str, Any] = Field(default_factory=dict)


class RankExit(BaseModel):
    rank: Rank
    code: Int32 | None = None
    signal: Annotated[int, Field(ge=0, le=128)] | None = None
    # When it exited (the earliest failure is a job's root cause).
    at: Annotated[float, Field(allow_inf_nan=False)] | None = None
    stopped: bool = False  # stopped by Tidal after another rank failed


class ExitReport(BaseModel):
    agent_id: Ident
    job_id: JobId
    attempt: Int32
    ranks: list[RankExit] = Field(max_length=limits.MAX_RANKS)
