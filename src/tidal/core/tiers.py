"""SLA tiers, ordered: premium > standard > basic."""

from __future__ import annotations

import enum

from tidal.core.suggest import did_you_mean
from tidal.errors import ValidationError, shown


class Tier(enum.Enum):
    BASIC = "basic"
    STANDARD = "standard"
    PREMIUM = "premium"

    @property
    def rank(self) -> int:
        """0 for basic, 1 standard, 2 premium: a higher rank is served first."""
        return self._rank  # type: ignore[attr-defined,no-any-return]  # set below: no enum hashing per call

    @property
    def target(self) -> float | None:
        """SLA attainment target (Singularity): basic is best effort."""
        return _TARGET[self]

    @classmethod
    def parse(cls, value: str | Tier) -> Tier:
        if isinstance(value, Tier):
            return value
        try:
            return cls(value.strip().lower())
        except (ValueError, AttributeError):
            names = [t.value for t in reversed(TIERS_BY_RANK)]
            typo = did_you_mean(value.strip(), names) if isinstance(value, str) else ""
            raise ValidationError(f"unknown tier {shown(value)}{typo}", field="tier",
                                  hint="valid tiers: " + ", ".join(names)) from None

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Tier):
            return NotImplemented
        return self.rank >= other.rank


_RANK = {Tier.BASIC: 0, Tier.STANDARD: 1, Tier.PREMIUM: 2}
_TARGET: dict[Tier, float | None] = {Tier.BASIC: None, Tier.STANDARD: 0.70, Tier.PREMIUM: 0.95}
TIERS_BY_RANK = (Tier.BASIC, Tier.STANDARD, Tier.PREMIUM)
for _t, _r in _RANK.items():
    _t._rank = _r  # type: ignore[attr-defined]
