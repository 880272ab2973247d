"""Typed settings. Every setting can be given as an environment variable with the prefix ``TIDAL_``
(``TIDAL_HOME``, ``TIDAL_DATABASE_URL`` ...). CRIU is found by
:mod:`tidal.mechanisms.criu.provision` (``TIDAL_CRIU``, ``TIDAL_CRIU_PREFIX``). State lives under ``TIDAL_HOME``
(default ``~/.tidal``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDAL_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".tidal", description="Tidal's state directory")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite under home")
    checkpoint_store: str | None = Field(
        default=None, description="checkpoint store: a directory or an fsspec URL; default home/checkpoints"
    )
    keep_checkpoints: int = Field(default=3, ge=1, description="good checkpoints kept per job (bad ones besides)")
    quotas: str | None = Field(
        default=None,
        description="per-project quotas for premium and standard jobs: 'project=share,...' ('*=share' for "
        "every other project); a job over its project's quota is admitted as basic",
    )
    cut_timeout: float = Field(
        default=30.0, gt=0, description="seconds a distributed job's ranks get to reach a consistent cut"
    )

    @property
    def store_url(self) -> str:
        return self.checkpoint_store or str(self.home / "checkpoints")

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'tidal.db'}"


def load_settings() -> Settings:
    return Settings()
