"""Request and response bodies of the API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class JobSubmit(BaseModel):
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
    to: str | None = None
    rank: int | None = None  # move only this rank (to ``to``)


class ResizeRequest(BaseModel):
    devices: int | None = None  # None: give D back to the scheduler (--auto)


class ResumeRequest(BaseModel):
    # ``from`` is a Python keyword: the attribute is ``from_``, the JSON field ``from``.
    from_: str | None = Field(default=None, alias="from")  # the checkpoint to resume from (default: newest)


class UserCreate(BaseModel):
    name: str
    role: str = "user"
    unix_user: str | None = None


class Register(BaseModel):
    name: str
    agent_id: str
    region: str = "local"
    cluster: str = "local"
    devices: int = Field(ge=1)
    cpus: list[list[int]]


class AgentHello(BaseModel):
    agent_id: str


class Heartbeat(BaseModel):
    agent_id: str
    # job id → {"attempt", "cpu_s", "rss_bytes", "output_bytes", "steps", "collectives", ...} for the jobs
    # running on the node
    jobs: dict[str, dict[str, float]] = Field(default_factory=dict)


class ActionResult(BaseModel):
    agent_id: str
    action_id: str
    ok: bool
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class RankExit(BaseModel):
    rank: int
    code: int | None = None
    signal: int | None = None
    at: float | None = None  # when it exited (the earliest failure is a job's root cause)
    stopped: bool = False  # stopped by Tidal after another rank failed


class ExitReport(BaseModel):
    agent_id: str
    job_id: str
    attempt: int
    ranks: list[RankExit]
