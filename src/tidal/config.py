"""Typed settings. Every setting can be given as an environment variable with the prefix ``TIDAL_``
(``TIDAL_HOME``, ``TIDAL_DATABASE_URL`` ...). CRIU is found by
:mod:`tidal.mechanisms.criu.provision` (``TIDAL_CRIU``, ``TIDAL_CRIU_PREFIX``). State lives under ``TIDAL_HOME``
(default ``~/.tidal``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDAL_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".tidal", description="Tidal's state directory")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite under home")
    checkpoint_store: str | None = Field(
        default=None, description="checkpoint store: a directory or an fsspec URL; default home/checkpoints"
    )
    store_endpoint_url: str | None = Field(
        default=None, description="S3 store: the endpoint of an S3-compatible server (default: AWS_ENDPOINT_URL, "
        "else AWS's own)"
    )
    store_access_key_id: str | None = Field(
        default=None,
        description="S3 store: access key id (default: the AWS chain: AWS_ACCESS_KEY_ID, a profile, a role)",
    )
    store_secret_access_key: SecretStr | None = Field(default=None, description="S3 store: the key's secret")
    store_region: str | None = Field(
        default=None, description="S3 store: region (default: AWS_REGION or the profile's)"
    )
    store_profile: str | None = Field(default=None, description="S3 store: a profile of ~/.aws/config to use")
    store_addressing_style: Literal["auto", "path", "virtual"] | None = Field(
        default=None, description="S3 store: bucket in the path or in the host name; default path when an endpoint "
        "URL is set (S3-compatible servers), else auto"
    )
    store_sse: Literal["AES256", "aws:kms", "aws:kms:dsse"] | None = Field(
        default=None, description="S3 store: server-side encryption asked for on every object (default: the bucket's)"
    )
    store_sse_kms_key_id: str | None = Field(default=None, description="S3 store: the KMS key for aws:kms")
    store_retries: int = Field(
        default=6, ge=1, description="checkpoint store: tries of a request that fails on the way or with a 5xx"
    )
    store_timeout: float = Field(
        default=30.0, gt=0, description="checkpoint store: seconds to connect, and to wait for an answer, per try"
    )
    store_concurrency: int | None = Field(
        default=None, ge=1, description="checkpoint store: chunks transferred at once (default: the cores for a "
        "directory, 16 for an object store)"
    )
    keep_checkpoints: int = Field(default=3, ge=1, description="good checkpoints kept per job (bad ones besides)")
    finished_retention: float = Field(
        default=7 * 86400.0, ge=0, description="seconds a finished job's checkpoints are kept after it ended (0: "
        "deleted at once)"
    )
    store_quota: str | None = Field(
        default=None, description="checkpoint bytes each user may keep: 'user=SIZE,...' ('*=SIZE' for every other "
        "user; SIZE in bytes or with K, M, G, T, Ki, Mi, Gi, Ti); none by default"
    )
    collect_every: float = Field(
        default=300.0, gt=0, description="seconds between the control plane's passes of checkpoint retention and "
        "garbage collection"
    )
    admit_sla: str = Field(
        default="off",
        description="admission against the load for premium and standard jobs that give their run time "
        "(tidal submit --runtime): off, demote (accepted at the highest lower tier whose target the load "
        "meets), refuse (refused with the estimate) or defer (kept at its tier, not scheduled until the estimate "
        "meets the target)",
    )
    quotas: str | None = Field(
        default=None,
        description="per-project quotas for premium and standard jobs: 'project=share,...' ('*=share' for "
        "every other project); a job over its project's quota is admitted as basic",
    )
    cut_timeout: float = Field(
        default=30.0, gt=0, description="seconds a distributed job's ranks get to reach a consistent cut"
    )
    region_gbps: float | None = Field(
        default=None, gt=0, description="GB/s between two regions that the scheduler counts on when it weighs "
        "moving a job to another region's cluster rather than preempting it, where no rate was measured from "
        "the checkpoints copied between them (default 0.5)"
    )
    # Per-user limits (docs/cluster.md, Limits): the defaults; an admin overrides them per user and per project
    # (`tidal user set`, `tidal project set`). 0 means no limit.
    user_rate: float = Field(
        default=50.0, ge=0, description="requests per second a user's tokens may make to the API, on average (0: no "
        "limit); beyond it, 429 with Retry-After"
    )
    user_burst: int = Field(default=500, ge=0, description="requests a user may make at once above that rate")
    admin_rate: float = Field(default=500.0, ge=0, description="requests per second of an admin (0: no limit)")
    admin_burst: int = Field(default=5000, ge=0, description="requests an admin may make at once above that rate")
    user_max_queued: int = Field(
        default=1000, ge=0, description="jobs a user may have waiting (pending, held or preempted) at once; a "
        "submission beyond is refused (0: no limit)"
    )
    user_max_devices: int = Field(
        default=0, ge=0, description="devices a user's jobs may hold at once; the scheduler leaves the others "
        "waiting (0: no limit)"
    )
    project_max_queued: int = Field(
        default=0, ge=0, description="jobs a project may have waiting at once, all its members' together (0: no "
        "limit)"
    )
    project_max_devices: int = Field(
        default=0, ge=0, description="devices a project's jobs may hold at once (0: no limit)"
    )
    stall_after: float = Field(
        default=300.0, gt=0, description="seconds without a step or collective after which a distributed job is "
        "reported stalled (an event, and `tidal show`)"
    )
    drain_lease_losses: int = Field(
        default=3, ge=0, le=100, description="a node whose lease is lost this many times within TIDAL_DRAIN_WINDOW "
        "is drained: nothing new is placed or restored there (0: never drained for it)"
    )
    drain_window: float = Field(
        default=600.0, gt=0, description="seconds within which TIDAL_DRAIN_LEASE_LOSSES lost leases drain a node"
    )
    drain_healthy_for: float = Field(
        default=600.0, ge=0, description="seconds a node drained for its lost leases must stay up, its lease renewed, "
        "before it is undrained"
    )

    @property
    def store_url(self) -> str:
        return self.checkpoint_store or str(self.home / "checkpoints")

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'tidal.db'}"


def load_settings() -> Settings:
    return Settings()
