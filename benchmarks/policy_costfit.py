"""Fit the simulator's cost model from the mechanism's measurements and write src/tidal/sim/cost_fit.py.

Inputs, newest first: ``bench-results/crosshost.json`` (plain CRIU dump, copy and restore of one image
between two hosts) and ``bench-results/elastic.json`` (the resize pause and its parts), as ``make bench``
writes them; where a file is missing, the figures published from a run of the same benchmark
(README "Across hosts", docs/cluster.md "Elastic resize: benchmark"), each named in the output.

The model (per rank of ``m`` GB, ``k`` ranks a device, ``r`` ranks over ``n`` nodes, link ``L`` GB/s a node):
    checkpoint = fixed + k·m / dump_gbps                         (the devices are free once the dump is written)
    restore    = fixed + r·m / (n·L) + k·m / restore_gbps        (fetch over the links, then CRIU restore)
    migration  = checkpoint + restore; a resize is a migration onto the new device set.
``dump_gbps`` and ``restore_gbps`` come from plain CRIU; ``fixed`` is what a Tidal resize pause takes
beyond moving bytes (the consistent cut, process-group teardown and rebuild, fetch verification); ``L`` is
the measured host-to-host copy rate. Run: ``.venv/bin/python benchmarks/policy_costfit.py [--check]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

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
        "source": "docs/cluster.md, Elastic resize: median resize pause 5.1 s of a 0.95 GB image",
        "image_bytes": 0.95 * GB, "pause_s": 5.1,
    },
}


def _load(name: str) -> dict[str, float | str]:
    path = ROOT / "bench-results" / f"{name}.json"
    if not path.exists():
        return dict(PUBLISHED[name])
    data = json.loads(path.read_text())
    if name == "crosshost":
        plain = data["migration"]["plain"]
        return {"source": f"{path.relative_to(ROOT)}: migration.plain", "image_bytes": plain["image_bytes"],
                "dump_s": plain["dump_s"], "copy_s": plain["copy_s"], "restore_s": plain["restore_s"]}
    return {"source": f"{path.relative_to(ROOT)}: resize_pause_s", "pause_s": data["resize_pause_s"],
            "image_bytes": statistics.median(r["image_bytes"] for r in data["resizes"])}


def fit(crosshost: dict[str, float | str], elastic: dict[str, float | str]) -> dict[str, float]:
    """The constants of the model from the two measurements (all in GB = 1e9 bytes and seconds)."""
    gb = float(crosshost["image_bytes"]) / GB
    dump = gb / float(crosshost["dump_s"])
    restore = gb / float(crosshost["restore_s"])
    link = gb / float(crosshost["copy_s"])
    m = float(elastic["image_bytes"]) / GB
    # A resize of a one-node job: checkpoint + restore = 2·fixed + m/dump + m/link + m/restore.
    moved = m / dump + m / link + m / restore
    fixed = max(0.0, (float(elastic["pause_s"]) - moved) / 2)
    return {"dump_gbps": round(dump, 3), "restore_gbps": round(restore, 3), "net_gbps_per_node": round(link, 3),
            "fixed_s": round(fixed, 3)}


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
    print(f"a 6 GB rank: checkpoint {ck:.1f} s, restore {rs:.1f} s, migration {ck + rs:.1f} s")
    if args.check:
        same = OUT.read_text() == text
        print("cost_fit.py is current" if same else "cost_fit.py is stale: rerun without --check")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
