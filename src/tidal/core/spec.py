"""What a user asks for: the job's specification (never changed by scheduling)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from tidal.core.tiers import Tier
from tidal.errors import ValidationError


@dataclasses.dataclass(frozen=True, slots=True)
class JobSpec:
    """A job of ``ranks`` (W) ranks; it may run on ``min_devices..max_devices`` devices (1 ≤ min ≤ max ≤ W)."""

    name: str
    command: tuple[str, ...]
    workdir: str
    ranks: int = 1
    tier: Tier = Tier.BASIC
    min_devices: int | None = None
    max_devices: int | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    checkpoint_every: float | None = None
    max_restarts: int = 3
    owner: str = ""
    project: str = "default"

    def __post_init__(self) -> None:
        # Normalise first (frozen: via object.__setattr__), then validate, so a JobSpec is always valid.
        set_ = object.__setattr__
        set_(self, "command", tuple(self.command))
        set_(self, "env", MappingProxyType(dict(self.env)))
        if isinstance(self.tier, str):
            set_(self, "tier", Tier.parse(self.tier))
        if self.min_devices is None:
            set_(self, "min_devices", 1)
        if self.max_devices is None:
            set_(self, "max_devices", self.ranks)
        self.validate()

    def validate(self) -> None:
        if not self.name or not self.name.strip():
            raise ValidationError("job name must not be empty", field="name")
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ValidationError("command must be a non-empty list of non-empty strings", field="command")
        if not self.workdir.startswith("/"):
            raise ValidationError(f"workdir must be absolute, got {self.workdir!r}", field="workdir")
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValidationError(f"ranks must be an integer ≥ 1, got {self.ranks!r}", field="ranks")
        lo, hi = self.min_devices, self.max_devices
        assert lo is not None and hi is not None
        if lo < 1:
            raise ValidationError(f"min_devices must be ≥ 1, got {lo}", field="min_devices")
        if hi > self.ranks:
            raise ValidationError(
                f"max_devices ({hi}) must be ≤ ranks ({self.ranks})", field="max_devices"
            )
        if lo > hi:
            raise ValidationError(
                f"min_devices ({lo}) must be ≤ max_devices ({hi})", field="min_devices"
            )
        if self.checkpoint_every is not None and not self.checkpoint_every > 0:
            raise ValidationError(
                f"checkpoint_every must be > 0 seconds, got {self.checkpoint_every}", field="checkpoint_every"
            )
        if self.max_restarts < 0:
            raise ValidationError(f"max_restarts must be ≥ 0, got {self.max_restarts}", field="max_restarts")
        for k, v in self.env.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k:
                raise ValidationError(f"bad environment variable {k!r}", field="env")
        if not self.project:
            raise ValidationError("project must not be empty", field="project")

    @property
    def elastic(self) -> bool:
        return self.min_devices != self.max_devices
