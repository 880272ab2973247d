"""Where jobs run: regions > clusters > nodes > devices (immutable)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

from tidal.core import limits
from tidal.errors import ValidationError

#: A node's ``--devices auto``: one device per NVIDIA GPU of the node.
AUTO_DEVICES = "auto"


def devices_option(text: str) -> int | str:
    """A node's ``--devices`` (``tidal agent``): a number N of CPU devices, from 1 to the most a node may have,
    or :data:`AUTO_DEVICES`."""
    if text == AUTO_DEVICES:
        return text
    try:
        n = int(text)
    except ValueError:
        raise ValidationError(f"--devices {text!r}: give a number of CPU devices, or auto (one device per NVIDIA "
                              "GPU)", field="devices") from None
    if not 1 <= n <= limits.MAX_DEVICES_PER_NODE:
        raise ValidationError(f"--devices {n}: a node offers from 1 to {limits.MAX_DEVICES_PER_NODE} devices",
                              field="devices")
    return n


class DeviceRef(NamedTuple):
    """One device: ``index`` on ``node`` (node names are unique across the topology)."""

    node: str
    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: the device's index on its node


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    name: str
    devices: int

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValidationError(f"node {self.name}: devices must be ≥ 1", field="devices")


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]

    @property
    def devices(self) -> int:
        return sum(n.devices for n in self.nodes)

    @property
    def devices_per_node(self) -> int:
        """The largest node: a gang that fits in it must stay on one node (locality)."""
        return max((n.devices for n in self.nodes), default=0)


@dataclasses.dataclass(frozen=True, slots=True)
class Region:
    name: str
    clusters: tuple[Cluster, ...]


@dataclasses.dataclass(frozen=True)
class Topology:
    regions: tuple[Region, ...]

    def __post_init__(self) -> None:
        seen_nodes: set[str] = set()
        seen_clusters: set[str] = set()
        node_cluster: dict[str, str] = {}
        cluster_region: dict[str, str] = {}
        for r in self.regions:
            for c in r.clusters:
                if c.name in seen_clusters:
                    raise ValidationError(f"duplicate cluster name {c.name!r}", field="cluster")
                seen_clusters.add(c.name)
                cluster_region[c.name] = r.name
                for n in c.nodes:
                    if n.name in seen_nodes:
                        raise ValidationError(f"duplicate node name {n.name!r}", field="node")
                    seen_nodes.add(n.name)
                    node_cluster[n.name] = c.name
        # Lookup tables, built once: the topology is immutable.
        object.__setattr__(self, "_node_cluster", node_cluster)
        object.__setattr__(self, "_cluster_region", cluster_region)
        object.__setattr__(self, "_nodes", {n.name: n for c in self.clusters() for n in c.nodes})
        object.__setattr__(self, "_clusters", {c.name: c for c in self.clusters()})

    @classmethod
    def uniform(cls, nodes: int, devices_per_node: int, *, cluster: str = "c0", region: str = "r0") -> Topology:
        """One region, one cluster of ``nodes`` nodes of ``devices_per_node`` devices each."""
        if nodes < 1 or devices_per_node < 1:
            raise ValidationError("a cluster needs ≥ 1 node of ≥ 1 device", field="cluster")
        ns = tuple(Node(f"{cluster}-n{i}", devices_per_node) for i in range(nodes))
        return cls((Region(region, (Cluster(cluster, ns),)),))

    def clusters(self) -> Iterator[Cluster]:
        for r in self.regions:
            yield from r.clusters

    def nodes(self) -> Iterator[Node]:
        for c in self.clusters():
            yield from c.nodes

    def node(self, name: str) -> Node:
        return self._nodes[name]  # type: ignore[attr-defined,no-any-return]

    def cluster(self, name: str) -> Cluster:
        return self._clusters[name]  # type: ignore[attr-defined,no-any-return]

    def cluster_of(self, node: str) -> str:
        return self._node_cluster[node]  # type: ignore[attr-defined,no-any-return]

    def region_of(self, cluster: str) -> str:
        return self._cluster_region[cluster]  # type: ignore[attr-defined,no-any-return]

    @property
    def devices(self) -> int:
        return sum(c.devices for c in self.clusters())
