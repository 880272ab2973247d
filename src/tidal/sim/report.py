"""The report: the JSON of issue 6 and matplotlib plots (PNG)."""

from __future__ import annotations

import json
import os
from typing import Any

from tidal.sim.experiment import Prepared

JSON_KEYS = ("avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "goodput", "allocation",
             "lost_device_hours", "preemptions", "migrations", "resizes", "sim_only_actions")


def to_json(p: Prepared, summaries: dict[str, dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for name, s in summaries.items():
        d = {k: s[k] for k in JSON_KEYS}
        d["jobs"] = s["jobs"]
        d["sla"] = {
            tier: {k: v for k, v in t.items()}
            for tier, t in s["sla"].items()
        }
        d["admission"] = s["admission"]
        policies[name] = d
    return {
        "policies": policies,
        "input": {
            **meta,
            "trace_jobs": p.trace_jobs,
            "simulated_jobs": len(p.jobs),
            "capacity_devices": p.cluster.topology.devices,
            "offered_load_before_rescaling": p.offered_load_before,
            "offered_load": p.offered_load,
            "excluded_too_large": len(p.excluded_too_large),
            "excluded_unknown_vc": p.excluded_unknown_vc,
            "bad_rows": [{"line": ln, "reason": r} for ln, r in p.bad_rows],
        },
    }


def write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=False)
        f.write("\n")


def write_plots(directory: str, summaries: dict[str, dict[str, Any]], series: dict[str, dict[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    out = []
    # JCT CDF per policy.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, s in series.items():
        xs = s["jct_sorted"]
        if xs:
            n = len(xs)
            ax.plot([max(x, 1.0) for x in xs], [(i + 1) / n for i in range(n)], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    out.append(_save(fig, directory, "jct_cdf.png"))
    # Goodput and allocation over time.
    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for name, s in series.items():
        # The submission window and a little after: the long tail of the last jobs is mostly empty.
        end = s["window"][0] + 1.2 * (s["window"][1] - s["window"][0])
        keep = [i for i, x in enumerate(s["t"]) if x <= end]
        t = [s["t"][i] / 3600 for i in keep]
        axes[0].plot(t, [s["goodput"][i] for i in keep], label=name, lw=1)
        axes[1].plot(t, [s["allocation"][i] for i in keep], label=name, lw=1)
    axes[0].set_ylabel("goodput")
    axes[1].set_ylabel("allocation")
    axes[1].set_xlabel("time (h)")
    for a in axes:
        a.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    out.append(_save(fig, directory, "goodput_allocation.png"))
    # SLA attainment per tier.
    tiers = ["premium", "standard", "basic"]
    names = list(summaries)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        vals = [summaries[name]["sla"].get(t, {}).get("attainment", 0.0) for t in tiers]
        ax.bar([k + i * width for k in range(len(tiers))], vals, width, label=name)
    ax.axhline(0.95, color="k", ls="--", lw=0.8)
    ax.axhline(0.70, color="k", ls=":", lw=0.8)
    ax.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(tiers))], tiers)
    ax.set_ylabel("SLA attainment (GPU-time weighted)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    out.append(_save(fig, directory, "sla_attainment.png"))
    return out


def _save(fig: Any, directory: str, name: str) -> str:
    """Write ``fig`` as the PNG ``name`` in ``directory`` and close it; returns the file's path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = os.path.join(directory, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
