"""Fairness between users: Tidal's policy with and without turns between users, on a window of Philly.

The Pollux processing of the Philly log has no user ids (docs/scheduling.md), so each job gets a synthetic
user (``tidal.sim.trace.assign_users``, seeded): jobs of a virtual cluster submitted within a minute of the
previous one form a burst (a sweep), one user's, drawn among the cluster's 8 users with Zipf weights 1/k (a
few users submit most bursts). Each row replays the window under ``singularity`` as the simulator evaluates
it, with users taking turns (``user_share``, the default) and without (one queue per project, as before);
with ``--flood N`` (a second row per load), one more user submits N one-device, one-hour basic jobs at once,
halfway through the window, in its busiest virtual cluster: the case the turns are for.

Per user: the mean waiting time of their jobs (submission to start, plus time preempted) and their mean
slowdown (JCT over the job's run time alone). Printed and written (``--json``): Jain's fairness index over
users, (Σx)² / (n·Σx²), of the per-user mean waiting time and of the per-user mean slowdown (1: every user
alike; 1/n: one user takes all the wait); the worst user's and the median user's mean wait; the mean wait of
the light users (those with at most ``--light`` jobs in the window) and of the heaviest tenth; and the
average JCT and tier attainment, to show what the turns cost. With a flood, also the other users' jobs of
its virtual cluster and tier submitted while it waited (from its submission until its last job started,
under either variant): how many, and their mean wait.

    .venv/bin/python benchmarks/fairness.py --flood 1000 --json bench-results/fairness.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from harness import run, write_json
from policies import STARTS, TRACE_FILES, TRACES, prepare_window
from tidal.core import Tier
from tidal.policy.registry import SIM_SINGULARITY
from tidal.policy.singularity import Singularity
from tidal.sim.engine import SimJob, SimResult, Simulator
from tidal.sim.experiment import prepare
from tidal.sim.metrics import summarize
from tidal.sim.trace import TraceJob, assign_users

VARIANTS = {"turns between users": True, "one queue per project": False}


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index of ``xs`` (1 where all are equal, or all zero)."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def per_user(jobs: Sequence[SimJob]) -> dict[str, dict[str, float]]:
    """Each user's finished jobs: how many, mean wait (s), mean slowdown (JCT ÷ run time)."""
    by: dict[str, list[SimJob]] = {}
    for j in jobs:
        if j.finish is not None:
            by.setdefault(j.owner, []).append(j)
    out = {}
    for user, js in by.items():
        slow = [(float(j.finish or 0.0) - j.submit) / j.duration for j in js if j.duration > 0]
        out[user] = {"jobs": len(js), "mean_wait_s": statistics.fmean(j.queue_s for j in js),
                     "mean_slowdown": statistics.fmean(slow) if slow else 1.0}
    return out


def figures(users: dict[str, dict[str, float]], light: int) -> dict[str, float]:
    waits = [u["mean_wait_s"] for u in users.values()]
    by_jobs = sorted(users.values(), key=lambda u: -u["jobs"])
    heavy = by_jobs[: max(1, len(by_jobs) // 10)]
    light_users = [u for u in users.values() if u["jobs"] <= light]

    def wait_of(us: list[dict[str, float]]) -> float:  # over their jobs, not per user
        n = sum(u["jobs"] for u in us)
        return sum(u["mean_wait_s"] * u["jobs"] for u in us) / n if n else 0.0

    return {
        "users": len(users),
        "jain_mean_wait": jain(waits),
        "jain_mean_slowdown": jain([u["mean_slowdown"] for u in users.values()]),
        "worst_user_mean_wait_s": max(waits),
        "median_user_mean_wait_s": statistics.median(waits),
        "light_users": len(light_users),
        "light_users_wait_s": wait_of(light_users),
        "heaviest_tenth_wait_s": wait_of(heavy),
    }


FLOODER = "flood/u1"


def with_flood(jobs: list[TraceJob], n: int, duration_s: float) -> tuple[list[TraceJob], str, float]:
    """``jobs`` and ``n`` one-device basic jobs of one more user, all submitted halfway through, in the
    virtual cluster with the most jobs; that cluster and the time."""
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.project] = counts.get(j.project, 0) + 1
    project = max(sorted(counts), key=lambda p: counts[p])
    at = (jobs[0].submit + jobs[-1].submit) / 2
    flood = [TraceJob(f"flood-{i}", at, duration_s, 1, Tier.BASIC, project, user=FLOODER) for i in range(n)]
    return sorted(jobs + flood, key=lambda j: (j.submit, j.id)), project, at


def during_flood(results: dict[str, SimResult], project: str, at: float) -> dict[str, dict[str, float]]:
    """Per variant, the other users' basic jobs of ``project`` submitted while the flood waited (until its
    last job started under either variant): how many, and their mean wait."""
    until = max(max(float(j.first_start or at) for j in r.jobs if j.owner == FLOODER) for r in results.values())
    out = {}
    for name, r in results.items():
        js = [j for j in r.jobs if j.owner != FLOODER and j.project == project and j.tier is Tier.BASIC
              and at <= j.submit <= until and j.finish is not None]
        out[name] = {"others_jobs": len(js), "others_wait_s": statistics.fmean(j.queue_s for j in js) if js else 0.0,
                     "flood_drained_s": until - at}
    return out


def run_row(cluster: str, load: float, jobs: int, start: int, light: int, flood: int,
            flood_s: float) -> dict[str, Any]:
    p = prepare(str(TRACES / TRACE_FILES["philly"]), cluster, load=None, limit=start + jobs)
    p.jobs = assign_users(p.jobs[start:])  # on the trace's own times, before they are rescaled to the load
    p = prepare_window(p, load)
    out: dict[str, Any] = {"cluster": cluster, "load": load, "flood": flood, "variants": {}}
    project, at = "", 0.0
    if flood:
        p.jobs, project, at = with_flood(p.jobs, flood, flood_s)
        out["flood_project"] = project
    out["jobs"] = len(p.jobs)
    results: dict[str, SimResult] = {}
    for name, turns in VARIANTS.items():
        t0 = time.perf_counter()
        cfg = dataclasses.replace(SIM_SINGULARITY, user_share=turns)
        r = results[name] = Simulator(p.cluster.topology, p.jobs, Singularity(cfg)).run()
        s = summarize(r)
        users = per_user(r.jobs)
        out["variants"][name] = {
            **figures(users, light), "avg_jct_s": s["avg_jct_s"], "avg_queue_s": s["avg_queue_s"],
            "premium_attainment": s["sla"].get("premium", {}).get("attainment", 1.0),
            "standard_attainment": s["sla"].get("standard", {}).get("attainment", 1.0),
            "wall_s": time.perf_counter() - t0, "per_user": users}
    if flood:
        for name, v in during_flood(results, project, at).items():
            out["variants"][name].update(v)
    return out


COLUMNS = (("users", "users", "{:,.0f}"), ("Jain (mean wait)", "jain_mean_wait", "{:.3f}"),
           ("Jain (mean slowdown)", "jain_mean_slowdown", "{:.3f}"),
           ("worst user's mean wait (s)", "worst_user_mean_wait_s", "{:,.0f}"),
           ("median user's mean wait (s)", "median_user_mean_wait_s", "{:,.0f}"),
           ("light users' wait (s)", "light_users_wait_s", "{:,.0f}"),
           ("heaviest tenth's wait (s)", "heaviest_tenth_wait_s", "{:,.0f}"),
           ("avg JCT (s)", "avg_jct_s", "{:,.0f}"), ("premium att.", "premium_attainment", "{:.3f}"),
           ("standard att.", "standard_attainment", "{:.3f}"))


FLOOD_COLUMNS = (("others' jobs during the flood", "others_jobs", "{:,.0f}"),
                 ("their mean wait (s)", "others_wait_s", "{:,.0f}"))


def table(rows: list[dict[str, Any]]) -> list[str]:
    flood = any(r["flood"] for r in rows)
    cols = COLUMNS + (FLOOD_COLUMNS if flood else ())
    out = ["| cluster | load | flood | policy | " + " | ".join(c for c, _, _ in cols) + " |",
           "|---|---|---:|---|" + "---:|" * len(cols)]
    for r in rows:
        for name, v in r["variants"].items():
            out.append(f"| {r['cluster']} | {r['load']} | {r['flood']:,} | {name} | "
                       + " | ".join(fmt.format(v[k]) if k in v else "" for _, k, fmt in cols) + " |")
    return out


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Per row, each user's mean wait, users sorted from least to most, with and without turns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floods = sorted({r["flood"] for r in rows})
    cols = sorted({(r["cluster"], r["load"]) for r in rows})
    fig, axes = plt.subplots(len(floods), len(cols), figsize=(4.5 * len(cols), 3.4 * len(floods)), squeeze=False)
    for r in rows:
        ax = axes[floods.index(r["flood"])][cols.index((r["cluster"], r["load"]))]
        for name, v in r["variants"].items():
            waits = sorted(max(u["mean_wait_s"], 1.0) for u in v["per_user"].values())
            ax.plot(range(1, len(waits) + 1), waits, label=f"{name} (Jain {v['jain_mean_wait']:.3f})")
        ax.set_yscale("log")
        ax.set_title(f"Philly {r['cluster']}, load {r['load']}" + (f", flood of {r['flood']:,}" if r["flood"] else ""),
                     fontsize=9)
        ax.set_xlabel("users, by mean wait")
        ax.set_ylabel("user's mean wait (s, ≥ 1)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8000, help="jobs in the window")
    ap.add_argument("--start", type=int, default=STARTS["philly"], help="first job of the window")
    ap.add_argument("--loads", default="1.0,1.2,1.5")
    ap.add_argument("--clusters", default="32x8")
    ap.add_argument("--light", type=int, default=10, help="a light user has at most this many jobs in the window")
    ap.add_argument("--flood", type=int, default=0, help="also run each load with one user's flood of this many jobs")
    ap.add_argument("--flood-s", type=float, default=3600.0, help="run time of each job of the flood (s)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="write a plot of each row's per-user mean waits (PNG) here")
    args = ap.parse_args()
    rows = []
    t0 = time.perf_counter()
    for cluster in args.clusters.split(","):
        for load in map(float, args.loads.split(",")):
            for flood in ((0, args.flood) if args.flood else (0,)):
                r = run_row(cluster, load, args.jobs, args.start, args.light, flood, args.flood_s)
                rows.append(r)
                on, off = r["variants"]["turns between users"], r["variants"]["one queue per project"]
                print(f"{cluster:5} load {load:<4} flood {flood:<5} Jain (mean wait) {off['jain_mean_wait']:.3f} → "
                      f"{on['jain_mean_wait']:.3f}  light users' wait {off['light_users_wait_s']:,.0f} → "
                      f"{on['light_users_wait_s']:,.0f} s  avg JCT {off['avg_jct_s']:,.0f} → {on['avg_jct_s']:,.0f} s",
                      flush=True)
    print("\n".join(table(rows)))
    meta = {"command": "benchmarks/fairness.py " + " ".join(sys.argv[1:]), "wall_s": time.perf_counter() - t0}
    write_json(args.json, {"meta": meta, "rows": rows})
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    run(main)
