#!/usr/bin/env python3
"""Pauses as a job sees them through a running cluster: a W = 4 DDP job's periodic checkpoints on one node and
spread over two, and its resizes within one node.

Each round starts a local cluster (``tidal up``: the control plane and its agents as processes of their own,
talking HTTP) of one node with 4 devices or of two nodes with 2 devices each, submits ``benchmarks/ddp_steps.py``
as 4 ranks with ``--checkpoint-every``, lets it take checkpoints, then (one node only) resizes it 4 → 2 → 4 with
``tidal resize``, and takes it down. Rounds of the two layouts alternate, so both see the same machine.

A pause is read from the ranks' own output, where each step prints the rank's monotonic clock: every step
interval longer than ``--gap`` × the job's median step is a rank waiting; such intervals of different ranks that
overlap are one wait of the job, from the earliest rank's last step before it to the latest rank's first step
after it. A checkpoint's pause is the longest wait that begins from half a second before its request (the
event's time) to 5 s after and before the next request, less one median step (the work of that interval); a
checkpoint with no such wait is reported as unmatched. This is what the job loses, with every round trip between
the agents and the control plane in it (the mechanism's own figures, without them, are in benchmarks/interpose.py
and benchmarks/elastic.py). Target: the two-node pause ≤ 1.3 × the one-node pause.

Run as root with CRIU provisioned (``make criu``). Prints a table and writes JSON (``--json FILE``).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import BenchmarkError, arguments, base_env, host_ranks, machine, run, say, wait_for, workspace, write_json

WORKLOAD = Path(__file__).resolve().with_name("ddp_steps.py")
STEP = re.compile(r"^rank \d+ step \d+ t ([0-9.]+) ", re.M)
LAYOUTS = {"one node": (1, 4), "two nodes": (2, 2)}


class Cluster:
    """``tidal`` commands against one local cluster under ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**base_env(), "TIDAL_HOME": str(home)}
        self.tidal = str(Path(sys.executable).with_name("tidal"))

    def __call__(self, *args: str, cwd: Path | None = None) -> str:
        out = subprocess.run([self.tidal, *args], env=self.env, cwd=cwd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise BenchmarkError(f"tidal {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()[-1500:]}",
                                 hint=f"the cluster's logs are under {self.home}/logs")
        return out.stdout

    def show(self, job: str) -> dict[str, Any]:
        return dict(json.loads(self("show", job, "-o", "json")))

    def events(self, job: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in json.loads(self("events", "--job", job, "-n", "10000", "-o", "json")) if e["kind"] == kind]

    def logs(self, job: str) -> list[Path]:
        return sorted(self.home.glob(f"nodes/*/ranks/{job}/*/output.log"))


def step_times(path: Path) -> list[float]:
    return [float(m[1]) for m in STEP.finditer(path.read_text(errors="replace"))]


def gaps(logs: list[Path], gap: float) -> tuple[list[tuple[float, float]], float]:
    """Where the job waited (see the module's text): (from, to) on the ranks' monotonic clock, and its median
    step."""
    series = [step_times(p) for p in logs]
    steps = [b - a for s in series for a, b in itertools.pairwise(s)]
    if not steps:
        raise BenchmarkError("the job printed no steps", hint="look at its ranks' output under the cluster's home")
    median = statistics.median(steps)
    waits = sorted((a, b) for s in series for a, b in itertools.pairwise(s) if b - a > gap * median)
    merged: list[tuple[float, float]] = []
    for a, b in waits:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged, median


def pause_at(waits: list[tuple[float, float]], median: float, asked: float, until: float) -> float | None:
    """The job's pause for a checkpoint asked at ``asked`` (monotonic): the longest wait that begins from half a
    second before (the step under way at the request) to 5 s after (the cut is made at a collective, a step or so
    later) and before ``until`` (the next request), less one median step; None when there is none."""
    near = [b - a for a, b in waits if asked - 0.5 <= a <= min(asked + 5.0, until)]
    return max(near) - median if near else None


def round_of(where: str, i: int, base: Path, checkpoints: int, every: float, gap: float) -> dict[str, Any]:
    nodes, devices = LAYOUTS[where]
    home, work = base / f"home-{i}-{nodes}", base / f"work-{i}-{nodes}"
    work.mkdir(parents=True)
    cluster = Cluster(home)
    say(f"round {i + 1}, {where}: tidal up -n {nodes} -d {devices}")
    cluster("up", "-n", str(nodes), "-d", str(devices))
    try:
        job = cluster("submit", "-q", "--ranks", "4", "--min-devices", "1", "--checkpoint-every", f"{every:g}s",
                      "--", sys.executable, str(WORKLOAD), "--steps", "100000000", cwd=work).strip()
        wait_for(lambda: len(cluster.logs(job)) == 4 and min(len(step_times(p)) for p in cluster.logs(job)) > 50,
                 300, "the job to train")
        seen = len(cluster.events(job, "checkpointing"))  # the first ones may fall in the ranks' start-up
        say(f"round {i + 1}, {where}: {checkpoints} periodic checkpoints")
        wait_for(lambda: len(cluster.events(job, "checkpointing")) >= seen + checkpoints, 600,
                 f"{checkpoints} periodic checkpoints", interval=0.5)
        if nodes == 1:
            for d in (2, 4):
                wait_for(lambda: not cluster.show(job)["busy"], 120, "the checkpoint in flight to end", interval=0.1)
                say(f"round {i + 1}, {where}: tidal resize --devices {d}")
                cluster("resize", job, "--devices", str(d))
        wait_for(lambda: not cluster.show(job)["busy"], 120, "the checkpoint in flight to end", interval=0.1)
        latest = max(step_times(p)[-1] for p in cluster.logs(job))
        wait_for(lambda: min(step_times(p)[-1] for p in cluster.logs(job)) > latest + 1, 60,
                 "every rank to step again")
        # The ranks print the machine's monotonic clock; the events carry the wall clock of the same machine.
        offset = time.time() - time.monotonic()
        waits, median = gaps(cluster.logs(job), gap)
        out: dict[str, Any] = {"nodes": nodes, "devices_per_node": devices, "median_step_s": median,
                               "checkpoint_pauses_s": [], "resize_pauses_s": [], "unmatched": 0}
        asked = cluster.events(job, "checkpointing")[seen:]
        for e, after in itertools.zip_longest(asked, asked[1:]):
            until = float(after["time"]) - offset if after else float("inf")
            p = pause_at(waits, median, float(e["time"]) - offset, until)
            if p is None:
                out["unmatched"] += 1
            else:
                out["resize_pauses_s" if "resize" in e["detail"] else "checkpoint_pauses_s"].append(p)
        cluster("cancel", job)
        return out
    finally:
        cluster("down")


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench-cluster-pause")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each layout, alternating")
    p.add_argument("--checkpoints", type=int, default=3, help="periodic checkpoints measured per round")
    p.add_argument("--every", type=float, default=6.0, help="seconds between periodic checkpoints")
    p.add_argument("--gap", type=float, default=6.0, help="a step this many times the median is a pause")
    args = p.parse_args()
    host_ranks()
    out: dict[str, Any] = {"machine": machine(with_torch=True), "rounds": []}
    with workspace(args.dir) as base:
        for i in range(args.rounds):
            for where in LAYOUTS:
                out["rounds"].append({"layout": where, **round_of(where, i, base, args.checkpoints, args.every,
                                                                   args.gap)})
    out["machine"]["load_average_at_end"] = os.getloadavg()
    med = statistics.median
    by = {w: [p for r in out["rounds"] if r["layout"] == w for p in r["checkpoint_pauses_s"]] for w in LAYOUTS}
    resizes = [p for r in out["rounds"] for p in r["resize_pauses_s"]]
    out["checkpoint_pause_median_s"] = {w: med(v) for w, v in by.items()}
    out["two_over_one"] = out["checkpoint_pause_median_s"]["two nodes"] / out["checkpoint_pause_median_s"]["one node"]
    out["resize_pause_median_s"] = med(resizes) if resizes else None
    m = out["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, kernel {m['kernel']}, CRIU {m['criu']}, torch {m['torch']}, "
          f"load average {m['load_average_at_start'][0]:.2f} at start, {m['load_average_at_end'][0]:.2f} at end")
    print(f"{'layout':>10} {'pauses':>7} {'median s':>9} {'min s':>6} {'max s':>6} {'step ms':>8}")
    for w, v in by.items():
        step = med(r["median_step_s"] for r in out["rounds"] if r["layout"] == w)
        print(f"{w:>10} {len(v):>7} {med(v):>9.3f} {min(v):>6.3f} {max(v):>6.3f} {step * 1e3:>8.1f}")
    if resizes:
        print(f"{'resize':>10} {len(resizes):>7} {med(resizes):>9.3f} {min(resizes):>6.3f} {max(resizes):>6.3f}   "
              "(one node, 4 → 2 → 4 devices, through the cluster)")
    unmatched = sum(r["unmatched"] for r in out["rounds"])
    if unmatched:
        print(f"{unmatched} checkpoint(s) with no pause found in the ranks' output (not counted)")
    print(f"checkpoint pause, two nodes / one node: {out['two_over_one']:.2f}x (target ≤ 1.3x)")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
