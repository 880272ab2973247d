"""The cost model's constants, fitted from the mechanism's benchmarks by benchmarks/policy_costfit.py
(generated: edit that script or rerun it, not this file).

Sources:
- README.md, Across hosts: plain CRIU, 1.25 GiB: dump 0.72 s, copy 1.13 s, restore 0.69 s
- docs/cluster.md, Elastic resize: 12 resizes of a W = 4 job of 0.93 GB, median 0.98 s local, 3.01 s store
"""

from __future__ import annotations

DUMP_GBPS = 1.864
RESTORE_GBPS = 1.945
NET_GBPS_PER_NODE = 1.188
FIXED_S = 0.785
LOCAL_FIXED_S = 0.111
SOURCES = (
    'README.md, Across hosts: plain CRIU, 1.25 GiB: dump 0.72 s, copy 1.13 s, restore 0.69 s',
    'docs/cluster.md, Elastic resize: 12 resizes of a W = 4 job of 0.93 GB, median 0.98 s local, 3.01 s store',
)
