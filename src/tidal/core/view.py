"""The immutable view that ``decide`` reads: the topology and every live job with its placement."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from tidal.core.lifecycle import JobState
from tidal.core.tiers import Tier
from tidal.core.topology import DeviceRef, Topology
from tidal.errors import ValidationError


def rank_map(devices: tuple[DeviceRef, ...], ranks: int) -> tuple[DeviceRef, ...]:
    """Rank → device for W ranks packed contiguously on D ≤ W devices (replica splicing)."""
    d = len(devices)
    if d == ranks:
        return devices  # one rank a device: the identity map
    return tuple(devices[r * d // ranks] for r in range(ranks)) if d else ()


@dataclasses.dataclass(frozen=True, slots=True)
class JobView:
    """What the policy knows of a job. ``placement`` is rank → device (length W) while it holds devices."""

    id: str
    ranks: int
    tier: Tier
    submitted_at: float
    state: JobState = JobState.PENDING
    project: str = "default"
    min_devices: int = 1
    max_devices: int = 0  # 0 means W
    placement: tuple[DeviceRef, ...] = ()
    started_at: float | None = None  # last start or resume: for the minimum run time between preemptions
    attained_device_s: float = 0.0  # device-seconds of service before ``started_at`` (2D-LAS)
    home_cluster: str | None = None  # pinned to a cluster (e.g. a virtual cluster), else anywhere
    last_cluster: str | None = None  # where its checkpoint lies, for the cost of moving it
    duration_hint: float | None = None  # oracle run time at full size (simulator only: SJF/SRTF)
    remaining_hint: float | None = None  # oracle remaining run time at full size at ``started_at``
    requested_tier: Tier | None = None  # the tier asked for, where admission gave a lower one (``tier``)
    home_region: str | None = None  # pinned to a region's clusters (tidal submit --region), else anywhere
    image_gb: float | None = None  # its checkpoint image, all ranks, GB, where known: what a move transfers
    # The user who submitted it: users of a project take turns by the devices they hold, and a user's devices
    # may be capped (``ClusterView.device_caps``). "" where unknown (a trace without users: one user).
    owner: str = ""

    @property
    def devices(self) -> tuple[DeviceRef, ...]:
        """Distinct devices held, in placement order."""
        return tuple(dict.fromkeys(self.placement))

    @property
    def max_d(self) -> int:
        return self.max_devices or self.ranks


@dataclasses.dataclass(frozen=True, slots=True)
class Links:
    """The network a job's image crosses when it moves to another cluster, in GB/s: each node's own link
    (``node_gbps``; a move within a region fetches over the target nodes' links), and the link between two
    regions (``region_gbps``, in all). ``pair_gbps``: the rate from one region to another where it is known
    better, by (from region, to region) (live: measured from the copies between their stores); the pairs not
    in it get ``region_gbps``. The defaults are the simulator's cost model's (tidal.sim.cost), which has one
    rate between every two regions."""

    node_gbps: float = 1.188
    region_gbps: float = 0.5
    pair_gbps: Mapping[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("node_gbps", "region_gbps"):
            rate = getattr(self, name)
            if not rate > 0:
                raise ValidationError(f"{name} must be a rate above 0 GB/s, not {rate}", field=name)
        for (a, b), rate in self.pair_gbps.items():
            if not rate > 0:
                raise ValidationError(f"pair_gbps: the rate from region {a} to {b} must be above 0 GB/s, not {rate}",
                                      field="pair_gbps")
        if not isinstance(self.pair_gbps, MappingProxyType):
            object.__setattr__(self, "pair_gbps", MappingProxyType(dict(self.pair_gbps)))

    def between(self, source: str, target: str) -> float:
        """GB/s from region ``source`` to region ``target``: the pair's own rate where known, else
        ``region_gbps``."""
        return self.pair_gbps.get((source, target), self.region_gbps)

    def transfer_s(self, image_gb: float, nodes: int, *, cross_region: bool,
                   regions: tuple[str, str] | None = None) -> float:
        """Seconds to fetch ``image_gb`` onto ``nodes`` nodes, from another region with ``cross_region``:
        ``regions`` (from, to) where known, over that pair's rate (:meth:`between`)."""
        t = image_gb / (max(nodes, 1) * self.node_gbps)
        if not cross_region:
            return t
        rate = self.between(*regions) if regions is not None else self.region_gbps
        return max(t, image_gb / rate)


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """A read-only snapshot: the policy never mutates it; only dispatched actions change the world.

    ``generation`` changes when the world diverged from what events and the policy's own actions
    describe (a restart, a failed action): the policy then rebuilds its indexes from the view.

    ``drained``: nodes of the topology that take nothing new (a node that kept losing its lease, or one an
    admin drained): no job is placed, resumed, moved or grown onto them, while the jobs already there stay
    where they are. Their devices stay in the topology (the jobs on them hold some).
    ``device_caps``: the most devices each user named may hold at once (jobs of every project and tier
    together); a user not named has no cap. ``project_caps``: likewise for each project named (jobs of every
    user and tier of the project together).
    """

    topology: Topology
    jobs: Mapping[str, JobView]
    generation: int = 0
    links: Links = Links()  # between clusters and regions: what a move's transfer is estimated over
    drained: frozenset[str] = frozenset()
    device_caps: Mapping[str, int] = dataclasses.field(default_factory=dict)
    project_caps: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, MappingProxyType):
            object.__setattr__(self, "jobs", MappingProxyType(dict(self.jobs)))
        if not isinstance(self.drained, frozenset):
            object.__setattr__(self, "drained", frozenset(self.drained))
        for field, whose, who in (("device_caps", "user", "they"), ("project_caps", "project", "its jobs")):
            caps: Mapping[str, int] = getattr(self, field)
            for name, cap in caps.items():
                if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
                    raise ValidationError(f"device cap of {whose} {name!r} must be a whole number of devices, 0 or "
                                          f"more, not {cap!r}", field=field,
                                          hint=f"give each capped {whose} the most devices {who} may hold, e.g. 8")
            if not isinstance(caps, MappingProxyType):
                object.__setattr__(self, field, MappingProxyType(dict(caps)))
