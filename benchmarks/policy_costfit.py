"""Fit the simulator's cost model from the mechanism's measurements and write src/tidal/sim/cost_fit.py.

Inputs, newest first: ``bench-results/crosshost.json`` (plain CRIU dump, copy and restore of one image
between two hosts) and ``bench-results/elastic.json`` (every resize of a W-rank job on one node, each with
its pause and where it was restored from), as ``make bench`` writes them (run elastic.py with
``--restore-from both``); where a file is missing, the figures published from a run of the same benchmark
(README "Across hosts", docs/cluster.md "Elastic resize: benchmark"), each named in the output.

The model (per rank of ``m`` GB, ``k`` ranks a device, ``r`` ranks over ``n`` nodes, link ``L`` GB/s a node):
    checkpoint = fixed + ceil(r/n)·m / dump_gbps               (a node's ranks dump one after another; the
                                                              devices are free once the dump is written)
    restore    = fixed + r·m / (n·L) + k·m / restore_gbps      (fetch over the links, then CRIU restore)
    migration  = checkpoint + restore; a resize is a migration onto the new device set;
    within one node: both steps with local_fixed instead of fixed, and no fetch (restored from the images
    dumped there; the commit to the store after the job runs again).
``dump_gbps`` and ``restore_gbps`` come from plain CRIU; ``fixed`` is what a Tidal resize pause from the store
takes beyond moving bytes (the consistent cut, process-group teardown and rebuild, the commit, fetch
verification), ``local_fixed`` the same for a resize from the node's images; each is the mean over the
measured resizes of that kind of (pause − the model's byte moving for that resize) / 2, so the model gives
their mean pause. ``L`` is the measured host-to-host copy rate.
Run: ``.venv/bin/python benchmarks/policy_costfit.py [--check]``.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "tidal" / "sim" / "cost_fit.py"
GB = 1e9
GIB = 1 << 30

# Published figures (one run each on the 2-core reference machine), used when the JSON is absent.
PUBLISHED = {
    "crosshost": {
        "source": "README.md, Across hosts: plain CRIU, 1.25 GiB: dump 0.72 s, copy 1.13 s, restore 0.69 s",
        "image_bytes": 1.25 * GIB, "dump_s": 0.72, "copy_s": 1.13, "restore_s": 0.69,
    },
    "elastic": {
        "source": "docs/cluster.md, Elastic resize: 12 resizes of a W = 4 job of 0.93 GB, median 0.98 s local, "
                  "3.01 s store",
        "world": 4,
        # (from devices, to devices, restored from, pause s, image bytes), in the order of the run.
        "resizes": [
            (4, 2, "store", 3.906, 921655920), (2, 1, "local", 1.068, 925540559),
            (1, 4, "store", 2.929, 926943371), (4, 2, "local", 0.953, 927794926),
            (2, 1, "store", 3.002, 928239549), (1, 4, "local", 0.970, 928346899),
            (4, 2, "store", 3.028, 928744882), (2, 1, "local", 1.047, 929111831),
            (1, 4, "store", 2.849, 929438903), (4, 2, "local", 0.966, 930706791),
            (2, 1, "store", 3.053, 930812554), (1, 4, "local", 0.988, 930856592),
        ],
    },
}


def _load(name: str) -> dict[str, Any]:
    path = ROOT / "bench-results" / f"{name}.json"
    if not path.exists():
        return dict(PUBLISHED[name])
    data = json.loads(path.read_text())
    if name == "crosshost":
        plain = data["migration"]["plain"]
        return {"source": f"{path.relative_to(ROOT)}: migration.plain", "image_bytes": plain["image_bytes"],
                "dump_s": plain["dump_s"], "copy_s": plain["copy_s"], "restore_s": plain["restore_s"]}
    return {"source": f"{path.relative_to(ROOT)}: resizes", "world": data["world_size"],
            "resizes": [(r["from"], r["to"], r.get("restored_from", "store"), r["gap_s"], r["image_bytes"])
                        for r in data["resizes"]]}


def fit(crosshost: dict[str, Any], elastic: dict[str, Any]) -> dict[str, float]:
    """The constants of the model from the two measurements (all in GB = 1e9 bytes and seconds)."""
    gb = float(crosshost["image_bytes"]) / GB
    dump = gb / float(crosshost["dump_s"])
    restore = gb / float(crosshost["restore_s"])
    link = gb / float(crosshost["copy_s"])
    world = int(elastic["world"])
    rest: dict[str, list[float]] = {"store": [], "local": []}
    for _, to, source, pause, image in elastic["resizes"]:
        m = float(image) / GB  # the whole job's image, on one node: its ranks dump one after another
        moved = m / dump + math.ceil(world / int(to)) * (m / world) / restore
        if source != "local":
            moved += m / link  # fetched from the store
        rest[source].append((float(pause) - moved) / 2)
    if not rest["store"] or not rest["local"]:
        raise SystemExit("the resize measurements need both kinds (elastic.py --restore-from both)")
    return {"dump_gbps": round(dump, 3), "restore_gbps": round(restore, 3), "net_gbps_per_node": round(link, 3),
            "fixed_s": round(max(0.0, statistics.mean(rest["store"])), 3),
            "local_fixed_s": round(max(0.0, statistics.mean(rest["local"])), 3)}


def render(consts: dict[str, float], sources: list[str]) -> str:
    lines = ['"""The cost model\'s constants, fitted from the mechanism\'s benchmarks by benchmarks/policy_costfit.py',
             "(generated: edit that script or rerun it, not this file).", "", "Sources:"]
    lines += [f"- {s}" for s in sources]
    lines += ['"""', "", "from __future__ import annotations", ""]
    for k, v in consts.items():
        lines.append(f"{k.upper()} = {v!r}")
    lines.append("SOURCES = (")
    lines += [f"    {s!r}," for s in sources]
    lines.append(")")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if cost_fit.py differs from a fresh fit")
    args = p.parse_args()
    cross, el = _load("crosshost"), _load("elastic")
    consts = fit(cross, el)
    text = render(consts, [str(cross["source"]), str(el["source"])])
    print(f"{'constant':20}{'value':>10}")
    for k, v in consts.items():
        print(f"{k:20}{v:>10}")
    m = 6.0
    ck = consts["fixed_s"] + m / consts["dump_gbps"]
    rs = consts["fixed_s"] + m / consts["net_gbps_per_node"] + m / consts["restore_gbps"]
    local = 2 * consts["local_fixed_s"] + m / consts["dump_gbps"] + m / consts["restore_gbps"]
    print(f"a 6 GB rank: checkpoint {ck:.1f} s, restore {rs:.1f} s, migration {ck + rs:.1f} s; a resize within "
          f"its node {local:.1f} s")
    if args.check:
        same = OUT.read_text() == text
        print("cost_fit.py is current" if same else "cost_fit.py is stale: rerun without --check")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
