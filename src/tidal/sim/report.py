"""The report: the JSON of issue 6, matplotlib plots (PNG), and one self-contained HTML page of both (the
plots embedded as base64 PNG, the tables as HTML: it opens offline, with nothing beside it)."""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Iterator
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
    os.makedirs(directory, exist_ok=True)
    return [_save(fig, directory, name) for name, fig in figures(summaries, series)]


def figures(summaries: dict[str, dict[str, Any]], series: dict[str, dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The plots of a run, each as (file name, matplotlib figure); the caller saves and closes each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    yield "jct_cdf.png", fig
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
    yield "goodput_allocation.png", fig
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
    yield "sla_attainment.png", fig


#: The report's columns: (heading, key of a policy's summary, format).
COLUMNS = (("avg JCT (s)", "avg_jct_s", "{:.0f}"), ("p50 JCT (s)", "p50_jct_s", "{:.0f}"),
           ("p99 JCT (s)", "p99_jct_s", "{:.0f}"), ("avg queue (s)", "avg_queue_s", "{:.0f}"),
           ("makespan (s)", "makespan_s", "{:.0f}"), ("goodput", "goodput", "{:.3f}"),
           ("allocation", "allocation", "{:.3f}"), ("lost dev-h", "lost_device_hours", "{:.1f}"),
           ("preemptions", "preemptions", "{}"), ("migrations", "migrations", "{}"), ("resizes", "resizes", "{}"))
TITLES = {"jct_cdf.png": "Job completion time (CDF)", "goodput_allocation.png": "Goodput and allocation over time",
          "sla_attainment.png": "SLA attainment per tier (dashed: premium's 95 % target; dotted: standard's 70 %)"}
STYLE = ("body{font:14px/1.4 system-ui,'DejaVu Sans',sans-serif;margin:1.5em;color:#1c2833}"
         "table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{padding:.25em .7em;border-bottom:1px solid #ddd;"
         "text-align:right}th:first-child,td:first-child{text-align:left}th{color:#707b7c;font-size:.85em}"
         "img{max-width:100%;border:1px solid #eee}figure{margin:1em 0}figcaption{color:#707b7c}")


def write_report(path: str, doc: dict[str, Any], summaries: dict[str, dict[str, Any]],
                 series: dict[str, dict[str, Any]]) -> None:
    """One HTML file with the run's input, its tables and its plots (``doc``: what :func:`to_json` gives)."""
    import matplotlib.pyplot as plt

    e = html.escape
    inp = doc["input"]
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Tidal simulation report</title>",
           f"<style>{STYLE}</style></head><body><h1>Tidal simulation report</h1>",
           f"<p>Trace <code>{e(str(inp.get('trace')))}</code> on <code>{e(str(inp.get('cluster')))}</code>: "
           f"{inp['simulated_jobs']} of {inp['trace_jobs']} jobs simulated on {inp['capacity_devices']} devices, "
           f"offered load {inp['offered_load']:.3f} (trace: {inp['offered_load_before_rescaling']:.3f}).</p>",
           "<h2>Policies</h2><table id='policies'><tr><th>policy</th>",
           *(f"<th>{e(h)}</th>" for h, _, _ in COLUMNS), "</tr>"]
    for name, s in summaries.items():
        out.append(f"<tr><td>{e(name)}</td>" + "".join(f"<td>{e(fmt.format(s[k]))}</td>" for _, k, fmt in COLUMNS)
                   + "</tr>")
    out.append("</table><h2>SLA attainment per tier</h2><table id='sla'><tr><th>policy</th>"
               "<th>premium</th><th>standard</th><th>basic</th></tr>")
    for name, s in summaries.items():
        cells = "".join(f"<td>{s['sla'][t]['attainment']:.3f}</td>" if t in s["sla"] else "<td>-</td>"
                        for t in ("premium", "standard", "basic"))
        out.append(f"<tr><td>{e(name)}</td>{cells}</tr>")
    out.append("</table><h2>Plots</h2>")
    for name, fig in figures(summaries, series):
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        data = base64.b64encode(buf.getvalue()).decode()
        title = TITLES.get(name, name)
        out.append(f"<figure><img alt='{e(title)}' data-plot='{e(name)}' src='data:image/png;base64,{data}'>"
                   f"<figcaption>{e(title)}</figcaption></figure>")
    out.append("<h2>Input</h2><pre>" + e(json.dumps(inp, indent=2)) + "</pre></body></html>\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))


def _save(fig: Any, directory: str, name: str) -> str:
    """Write ``fig`` as the PNG ``name`` in ``directory`` and close it; returns the file's path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = os.path.join(directory, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
