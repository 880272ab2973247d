"""Which checkpoint store each region uses (``tidal server --store``).

Images are large and regions far apart, so each region may have its own store: ``--store west=s3://a
--store east=s3://b``; a plain ``--store URL`` is every other region's (and, alone, everyone's). An agent is
told its region's store when it registers; a checkpoint is known to be in the stores of the regions that hold
it (:attr:`CheckpointRow.regions`), and a restore in another region replicates it first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from tidal.control.store.models import CheckpointRow, NodeRow
from tidal.errors import ValidationError

_REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class RegionStores:
    default: str | None = None
    regions: Mapping[str, str] = field(default_factory=dict)

    def for_region(self, region: str) -> str | None:
        return self.regions.get(region, self.default)

    def shared(self, a: str, b: str) -> bool:
        """Whether regions ``a`` and ``b`` use the same store (nothing to copy between them)."""
        return self.for_region(a) == self.for_region(b)

    def describe(self) -> str:
        parts = [f"{r}: {u}" for r, u in sorted(self.regions.items())]
        if self.default is not None:
            parts.append(f"{'other regions' if self.regions else 'every region'}: {self.default}")
        return "; ".join(parts) or "each agent's own setting (TIDAL_CHECKPOINT_STORE)"


def parse_stores(values: Iterable[str]) -> RegionStores:
    """``URL`` (the default) or ``REGION=URL``, each at most once. A value whose text before its first ``=``
    is not a region name (it holds ``:`` or ``/``) is a URL with ``=`` in it."""
    default: str | None = None
    regions: dict[str, str] = {}
    for raw in values:
        value = raw.strip()
        name, sep, url = value.partition("=")
        if sep and _REGION.match(name):
            if not url:
                raise ValidationError(f"--store {value}: no URL after {name}=", field="store",
                                      hint="give REGION=URL, e.g. --store west=s3://bucket/checkpoints")
            if name in regions:
                raise ValidationError(f"--store: region {name} is given twice", field="store",
                                      hint="give each region one store")
            regions[name] = url
        elif not value:
            raise ValidationError("--store: empty value", field="store", hint="give URL or REGION=URL")
        else:
            if default is not None:
                raise ValidationError(f"--store: two default stores ({default} and {value})", field="store",
                                      hint="give one plain URL (the default) and REGION=URL for the others")
            default = value
    return RegionStores(default, regions)


# -- in the control plane's transactions (the server puts its RegionStores in ``Database.info["stores"]``) --
def stores_of(s: Session) -> RegionStores:
    stores = s.info.get("stores")
    return stores if isinstance(stores, RegionStores) else RegionStores()


def regions_holding(s: Session, nodes: Iterable[str]) -> list[str] | None:
    """The regions whose store a checkpoint stored from ``nodes`` is in; None where every region shares one
    store (nothing to track)."""
    if not stores_of(s).regions:
        return None
    return sorted({row.region for n in nodes if (row := s.get(NodeRow, n)) is not None})


def source_for(s: Session, ck: CheckpointRow, region: str) -> str | None:
    """The store a restore in ``region`` must replicate ``ck`` from first; None when its own store has it."""
    stores = stores_of(s)
    if not ck.regions or any(stores.shared(r, region) for r in ck.regions):
        return None
    return stores.for_region(ck.regions[0])


def store_region(s: Session, ck: CheckpointRow, url: str | None) -> str | None:
    """The region of ``ck``'s whose store is ``url`` (the one a restore was told to copy it from); None when
    none is."""
    stores = stores_of(s)
    return next((r for r in ck.regions or () if stores.for_region(r) == url), None) if url else None


def replicated(s: Session, ck: CheckpointRow, regions: Iterable[str]) -> None:
    """``ck`` is now in the stores of ``regions`` too (a restore there replicated it)."""
    if ck.regions is not None:
        ck.regions = sorted(set(ck.regions) | set(regions))
