"""The evaluation matrix: every public trace with arrivals × loads × two cluster sizes × all policies.

For each row (trace, cluster, load) every policy replays the same jobs; Tidal's policy (``singularity``)
is compared against the best baseline of the row and each target is printed ✔ or ✘:
- average JCT ≤ 0.9 × FIFO's and priority-with-requeue's, ≤ 1.05 × Tiresias's and Gandiva's;
- goodput ≥ the best baseline's − 0.01;
- premium attainment ≥ 0.95 and premium queueing ≤ priority-with-requeue's;
- standard attainment ≥ 0.70 (among the jobs admitted as standard);
- zero lost device-hours; devices idle while jobs wait < 2 % of the run's device-hours;
- the row's simulations took ≤ 5 minutes (on this machine, all policies together).

The full matrix (every job of each trace) takes hours on 2 cores; ``--jobs N`` (default 8,000) replays a
window of N consecutive jobs of each trace instead, from job ``--start`` (by default 15,000 for Philly, past
its sparse first weeks), rescaled to the load. Writes a JSON (``--json``), the tables and plots into
docs/scheduling.md (``--docs``).

    .venv/bin/python benchmarks/policies.py --docs                 # the reduced matrix (≈ 10 min on 2 cores)
    .venv/bin/python benchmarks/policies.py --jobs 0 --json m.json  # the full matrix
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Any

from harness import run, write_json
from tidal.sim.experiment import prepare, run_policies

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
# The traces with arrival times and run times (see docs/scheduling.md for those without).
TRACE_FILES = {
    "philly": "philly-pollux/philly.csv.xz",
    "gavel-philly-vc": "philly-gavel-derived/gavel-msr-philly-vc-traces.tar.xz",
}
# Where the reduced matrix's window starts: past Philly's sparse first weeks (a handful of huge jobs on an
# empty cluster); Gavel's seed-0 sample from its start.
STARTS = {"philly": 15_000, "gavel-philly-vc": 0}
LOADS = (0.8, 1.0, 1.2, 1.5)
CLUSTERS = ("32x8", "64x8")
POLICIES = ("fifo", "priority-requeue", "tiresias", "gandiva", "singularity")
OURS = "singularity"
ROW_BUDGET_S = 300.0


def targets(s: dict[str, dict[str, Any]], wall_s: float) -> dict[str, tuple[bool, str]]:
    """Each target of the row: (met, the figure it was judged on)."""
    us = s[OURS]
    jct = us["avg_jct_s"]
    out: dict[str, tuple[bool, str]] = {}
    for name, bound in (("fifo", 0.9), ("priority-requeue", 0.9), ("tiresias", 1.05), ("gandiva", 1.05)):
        r = jct / s[name]["avg_jct_s"] if s[name]["avg_jct_s"] > 0 else 1.0
        out[f"JCT ≤ {bound}× {name}"] = (r <= bound, f"{r:.2f}×")
    best = max(s[n]["goodput"] for n in POLICIES if n != OURS)
    out["goodput ≥ best − 0.01"] = (us["goodput"] >= best - 0.01, f"{us['goodput']:.3f} vs {best:.3f}")
    sla = us["sla"]
    prem = sla.get("premium", {}).get("attainment", 1.0)
    out["premium ≥ 0.95"] = (prem >= 0.95, f"{prem:.3f}")
    pq, rq = sla.get("premium", {}).get("avg_queue_s", 0.0), s["priority-requeue"]["sla"].get(
        "premium", {}).get("avg_queue_s", 0.0)
    out["premium queue ≤ PR's"] = (pq <= rq + 1e-6, f"{pq:.0f} s vs {rq:.0f} s")
    std = sla.get("standard", {}).get("attainment", 1.0)
    out["standard ≥ 0.70"] = (std >= 0.70, f"{std:.3f}")
    out["no lost device-hours"] = (us["lost_device_hours"] == 0, f"{us['lost_device_hours']:.1f}")
    idle = us["idle_waiting_fraction"]
    out["idle while waiting < 2 %"] = (idle < 0.02, f"{idle * 100:.2f} %")
    out["row ≤ 5 min"] = (wall_s <= ROW_BUDGET_S, f"{wall_s:.0f} s")
    return out


def run_row(path: str, cluster: str, load: float, jobs: int, start: int) -> dict[str, Any]:
    limit = start + jobs if jobs else None
    p = prepare(path, cluster, load=None, limit=limit)
    if start:
        p.jobs = p.jobs[start:]
    p = prepare_window(p, load)
    t0 = time.perf_counter()
    summaries, _ = run_policies(p, list(POLICIES), workers=os.cpu_count() or 1)
    wall = time.perf_counter() - t0
    return {"jobs": len(p.jobs), "offered_load": p.offered_load, "wall_s": wall, "policies": summaries,
            "targets": {k: list(v) for k, v in targets(summaries, wall).items()}}


def prepare_window(p: Any, load: float) -> Any:
    from tidal.sim.trace import offered_load, rescale_load

    cap = p.cluster.topology.devices
    p.jobs = rescale_load(p.jobs, cap, load)
    p.offered_load = offered_load(p.jobs, cap)
    return p


def table(trace: str, rows: list[dict[str, Any]]) -> list[str]:
    keys = list(rows[0]["targets"])
    out = [f"### {trace}", "",
           "| cluster | load | jobs | " + " | ".join(POLICIES) + " | idle-wait | " + " | ".join(keys) + " |",
           "|---|---|---|" + "---:|" * len(POLICIES) + "---:|" + "---|" * len(keys)]
    for r in rows:
        jcts = " | ".join(f"{r['policies'][n]['avg_jct_s']:,.0f}" for n in POLICIES)
        marks = " | ".join(("✔ " if ok else "✘ ") + fig for ok, fig in r["targets"].values())
        out.append(f"| {r['cluster']} | {r['load']} | {r['jobs']:,} | {jcts} | "
                   f"{r['policies'][OURS]['idle_waiting_fraction'] * 100:.2f} % | {marks} |")
    out.append("")
    return out


def plot(results: dict[str, list[dict[str, Any]]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (trace, rows) in zip(axes[0], results.items(), strict=True):
        for cluster in CLUSTERS:
            rs = [r for r in rows if r["cluster"] == cluster]
            for n in POLICIES:
                if n == OURS:
                    continue
                best = [r["policies"][OURS]["avg_jct_s"] / r["policies"][n]["avg_jct_s"] for r in rs]
                ax.plot([r["load"] for r in rs], best, marker="o", label=f"÷ {n}, {cluster}",
                        ls="-" if cluster == CLUSTERS[0] else "--")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{trace}: singularity's average JCT ÷ each baseline's")
        ax.set_xlabel("load")
        ax.set_ylabel("JCT ratio")
        ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


def write_docs(results: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> None:
    doc = ROOT / "docs" / "scheduling.md"
    img = ROOT / "docs" / "img" / "scheduling-jct.png"
    plot(results, img)
    lines = [BEGIN, "", f"Command: `{meta['command']}` ({meta['wall_s'] / 60:.0f} min on {meta['cores']} cores; "
             f"windows of {meta['jobs']:,} jobs of each trace, from job {meta['start']}). Average JCT in seconds "
             "per policy; the targets are Tidal's (singularity's) figures.", ""]
    for trace, rows in results.items():
        lines += table(trace, rows)
    met = sum(ok for rows in results.values() for r in rows for ok, _ in r["targets"].values())
    total = sum(len(r["targets"]) for rows in results.values() for r in rows)
    lines += [f"Targets met: {met} of {total}.", "", f"![JCT ratios](img/{img.name})", "", END]
    text = doc.read_text() if doc.exists() else f"# Scheduling\n\n{BEGIN}\n{END}\n"
    a, b = text.index(BEGIN), text.index(END) + len(END)
    doc.write_text(text[:a] + "\n".join(lines) + text[b:])
    print(f"wrote {doc.relative_to(ROOT)} and {img.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8000, help="jobs per trace window (0: every job)")
    ap.add_argument("--start", type=int, default=None, help="first job of the window (default: per trace)")
    ap.add_argument("--traces", default=",".join(TRACE_FILES))
    ap.add_argument("--loads", default=",".join(map(str, LOADS)))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--docs", action="store_true", help="write the tables and plots into docs/scheduling.md")
    args = ap.parse_args()
    t0 = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    for trace in args.traces.split(","):
        path = str(TRACES / TRACE_FILES[trace])
        if not os.path.exists(path):
            print(f"error: {path} not found (the public traces live in ../shared/traces)", file=sys.stderr)
            return 2
        for cluster in args.clusters.split(","):
            for load in map(float, args.loads.split(",")):
                start = STARTS[trace] if args.start is None else args.start
                r = run_row(path, cluster, load, args.jobs, start)
                r.update(trace=trace, cluster=cluster, load=load)
                results.setdefault(trace, []).append(r)
                bad = [k for k, (ok, _) in r["targets"].items() if not ok]
                jct = r["policies"][OURS]["avg_jct_s"]
                print(f"{trace:16} {cluster:5} load {load:<4} {r['jobs']:>6} jobs {r['wall_s']:5.0f} s  "
                      f"singularity JCT {jct:10,.0f} s  ✘ {', '.join(bad) if bad else 'none'}", flush=True)
    wall = time.perf_counter() - t0
    for trace, rows in results.items():
        print("\n".join(table(trace, rows)))
    meta = {"command": "benchmarks/policies.py " + " ".join(sys.argv[1:]), "wall_s": wall,
            "cores": os.cpu_count(), "jobs": args.jobs,
            "start": args.start if args.start is not None else ", ".join(f"{t} {n:,}" for t, n in STARTS.items())}
    write_json(args.json, {"meta": meta, "results": results})
    if args.docs:
        write_docs(results, meta)
    return 0


if __name__ == "__main__":
    run(main)
