"""Reproduce the Helios artifact's Philly setup and compare with its published averages.

Helios (Hu et al., SC'21) replays Philly jobs submitted 2017-10-01 → 2017-11-30 per virtual cluster
(``philly_vc.csv``: 11 VCs, 8 GPUs a node), FIFO / SJF / SRTF, consolidated placement. Published:
FIFO 86,072 s / 56,531 s, SJF 34,272 s / 4,731 s, SRTF 30,683 s / 1,138 s (average JCT / queueing).
Our input is the Pollux processing of the trace (82,247 jobs, no retries), so figures differ; this
prints both side by side and writes JSON.

    PYTHONPATH=src python benchmarks/sim_helios.py [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from datetime import UTC, datetime

from harness import run, write_json
from tidal.policy import make_policy
from tidal.sim.cluster_spec import parse_cluster
from tidal.sim.engine import Simulator
from tidal.sim.metrics import summarize
from tidal.sim.trace import assign_tiers, load_trace

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "..", "shared", "traces")
PUBLISHED = {"fifo": (86_072, 56_531), "sjf": (34_272, 4_731), "srtf": (30_683, 1_138)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=os.path.join(TRACES, "philly-pollux", "philly.csv.xz"))
    ap.add_argument("--vc", default=os.path.join(TRACES, "philly-helios-artifact", "philly_vc.csv"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--policies", default="fifo,sjf,srtf")
    args = ap.parse_args()
    tr = load_trace(args.trace)
    lo = datetime(2017, 10, 1, tzinfo=UTC).timestamp()
    hi = datetime(2017, 12, 1, tzinfo=UTC).timestamp()
    spec = parse_cluster(args.vc)
    sizes = {c.name: c.devices for c in spec.topology.clusters()}
    window = [j for j in tr.jobs if lo <= tr.origin + j.submit < hi]
    kept = [j for j in window if j.project in sizes and j.gpus <= sizes[j.project]]
    unknown = sum(1 for j in window if j.project not in sizes)
    too_big = sum(1 for j in window if j.project in sizes and j.gpus > sizes[j.project])
    t0 = kept[0].submit
    jobs = assign_tiers([dataclasses.replace(j, submit=j.submit - t0) for j in kept], seed=0)
    out: dict[str, object] = {
        "jobs_in_window": len(window), "simulated": len(jobs), "excluded_unknown_vc": unknown,
        "excluded_too_large": too_big, "policies": {},
    }
    print(f"{len(window)} jobs submitted 2017-10-01..11-30; {len(jobs)} simulated, {unknown} of VCs not in "
          f"{os.path.basename(args.vc)}, {too_big} larger than their VC")
    print(f"{'policy':8} {'avg JCT (s)':>12} {'avg queue (s)':>14} {'Helios JCT':>11} {'Helios queue':>13}"
          f" {'wall (s)':>9}")
    for name in args.policies.split(","):
        t = time.monotonic()
        r = Simulator(spec.topology, jobs, make_policy(name), pinned=True).run()
        s = summarize(r)
        wall = time.monotonic() - t
        pub = PUBLISHED.get(name, (None, None))
        out["policies"][name] = {"avg_jct_s": s["avg_jct_s"], "avg_queue_s": s["avg_queue_s"],  # type: ignore[index]
                                 "helios_avg_jct_s": pub[0], "helios_avg_queue_s": pub[1], "wall_s": wall,
                                 "preemptions": s["preemptions"]}
        print(f"{name:8} {s['avg_jct_s']:12,.0f} {s['avg_queue_s']:14,.0f} {pub[0] or 0:11,} {pub[1] or 0:13,}"
              f" {wall:9.1f}")
        sys.stdout.flush()
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
