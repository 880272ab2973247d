"""``--cluster``: ``NxM`` (N nodes of M devices, one cluster), a YAML file, or a virtual-cluster CSV.

YAML::

    regions:
      - name: west
        clusters:
          - name: a
            nodes: 16          # count
            devices_per_node: 8

VC CSV (``vc,node num``, as the Helios artifact's ``philly_vc.csv``): one cluster per VC with 8 devices a
node; jobs are pinned to the cluster named by their project (their VC), as Helios simulates each VC alone.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re

import yaml

from tidal.core import Cluster, Node, Region, Topology
from tidal.errors import ValidationError


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    topology: Topology
    pinned: bool = False  # jobs run only in the cluster named by their project
    source: str = ""


_CLUSTER_FILE = "a cluster file is regions: [{name, clusters: [{name, nodes, devices_per_node}]}]"
_VC_CSV = "a virtual-cluster CSV has a header row, then one row a VC: its name and its node count, e.g. 'vc1,12'"


def parse_cluster(spec: str, *, vc_devices_per_node: int = 8) -> ClusterSpec:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)
    if m:
        return ClusterSpec(Topology.uniform(int(m.group(1)), int(m.group(2))), False, spec)
    if not os.path.exists(spec):
        raise ValidationError(
            f"--cluster {spec!r} is neither NxM nor an existing file", field="cluster",
            hint="e.g. 64x8, cluster.yaml, or philly_vc.csv",
        )
    if spec.endswith((".yaml", ".yml")):
        return ClusterSpec(_from_yaml(spec), False, spec)
    return ClusterSpec(_from_vc_csv(spec, vc_devices_per_node), True, spec)


def _from_yaml(path: str) -> Topology:
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("regions"), list):
        raise ValidationError(f"{path}: expected a mapping with a 'regions' list", field="cluster",
                              hint=_CLUSTER_FILE)
    regions = []
    for ri, r in enumerate(doc["regions"]):
        rname = str(r.get("name", f"r{ri}"))
        clusters = []
        for ci, c in enumerate(r.get("clusters") or []):
            cname = str(c.get("name", f"{rname}-c{ci}"))
            try:
                n, d = int(c["nodes"]), int(c["devices_per_node"])
            except (KeyError, TypeError, ValueError):
                raise ValidationError(f"{path}: cluster {cname} needs integer nodes and devices_per_node",
                                      field="cluster", hint=_CLUSTER_FILE) from None
            if n < 1 or d < 1:
                raise ValidationError(f"{path}: cluster {cname} needs ≥ 1 node of ≥ 1 device", field="cluster",
                                      hint="give it nodes ≥ 1 and devices_per_node ≥ 1, or leave it out")
            clusters.append(Cluster(cname, tuple(Node(f"{cname}-n{i}", d) for i in range(n))))
        regions.append(Region(rname, tuple(clusters)))
    if not any(r.clusters for r in regions):
        raise ValidationError(f"{path}: no clusters", field="cluster", hint=_CLUSTER_FILE)
    return Topology(tuple(regions))


def read_vc_csv(path: str, field: str = "cluster") -> list[tuple[str, int]]:
    """The rows of a VC CSV (``vc,node num``, one header row): (VC, node count)."""
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows[1:], start=2):
        if not row or not row[0].strip():
            continue
        try:
            n = int(row[1])
        except (IndexError, ValueError):
            raise ValidationError(f"{path}:{i}: expected 'vc,node num'", field=field, line=i, hint=_VC_CSV) from None
        if n < 0:
            raise ValidationError(f"{path}:{i}: negative node count {n}", field=field, line=i,
                                  hint="give the virtual cluster 0 or more nodes")
        out.append((row[0].strip(), n))
    if not out:
        raise ValidationError(f"{path}: no virtual clusters", field=field, hint=_VC_CSV)
    return out


def _from_vc_csv(path: str, per_node: int) -> Topology:
    clusters = [Cluster(vc, tuple(Node(f"{vc}-n{k}", per_node) for k in range(n))) for vc, n in read_vc_csv(path)]
    return Topology((Region("r0", tuple(clusters)),))
