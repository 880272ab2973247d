"""``tidal sim``: replay a job trace through the scheduling policies on a virtual clock."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal, cast

import typer

from tidal.errors import ValidationError
from tidal.sim.cost import DEFAULT_D2H_GBPS, DEFAULT_H2D_GBPS

DEFAULT_POLICIES = "fifo,priority-requeue,tiresias,gandiva,singularity"


def sim(
    trace: Annotated[str, typer.Option(help="Trace: Philly CSV(.xz), Gavel .trace/.tar.xz, or generic CSV; or a "
                                            "sample shipped with Tidal: sample:philly-week.")],
    cluster: Annotated[str, typer.Option(help="NxM (N nodes of M devices), a YAML file, or a VC CSV "
                                              "(sample:philly-vc: Philly's 11 VCs).")],
    load: Annotated[float | None, typer.Option(help="Rescale submissions to this offered load.")] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated policy names.")] = DEFAULT_POLICIES,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this directory.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write one self-contained HTML file with the tables and the "
                                                     "plots (embedded) here: it opens offline.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the tier assignment rule.")] = 0,
    tier_mix: Annotated[
        str, typer.Option(help="premium,standard,basic shares for traces without tiers.")
    ] = "0.2,0.3,0.5",
    on_bad_row: Annotated[str, typer.Option(help="skip or fail on a malformed trace row.")] = "skip",
    trace_format: Annotated[str, typer.Option("--format", help="auto, philly, gavel or generic.")] = "auto",
    limit: Annotated[int | None, typer.Option(help="Only the first N jobs of the trace.")] = None,
    workers: Annotated[int | None, typer.Option(help="Parallel processes (default: one a core).")] = None,
    event_log: Annotated[
        Path | None, typer.Option(help="Write every event and action to DIR/<policy>.jsonl.")
    ] = None,
    quota: Annotated[
        str | None,
        typer.Option(help="Admit premium and standard jobs against per-project quotas: 'project=share,...' "
                          "('*=share' for the others) or a VC CSV (shares of its nodes; sample:philly-vc: Philly's); "
                          "jobs over their project's quota run as basic."),
    ] = None,
    quota_scale: Annotated[float, typer.Option(help="Multiply every --quota share by this.")] = 1.0,
    admit_sla: Annotated[
        str, typer.Option(help="Premium and standard jobs whose SLA the load makes unreachable (by the admitted "
                               "backlog): off, demote (to the highest tier that meets its target), refuse, or "
                               "defer (held back until the admitted work ahead has finished enough to meet its "
                               "target).")
    ] = "off",
    gpu_mem_gb: Annotated[
        float, typer.Option(help="GPU memory in use per rank (GB): a checkpoint copies it to the host, then dumps it "
                                 "with the rank's host memory; 0: CPU jobs.")
    ] = 0.0,
    d2h_gbps: Annotated[
        float, typer.Option(help="Device-to-host copy rate of GPU memory at a checkpoint, GB/s (default: measured "
                                 "on an H100 by benchmarks/gpu_checkpoint.py; measure yours).")
    ] = DEFAULT_D2H_GBPS,
    h2d_gbps: Annotated[
        float, typer.Option(help="Host-to-device copy rate of GPU memory at a restore, GB/s (default: measured on "
                                 "an H100, as --d2h-gbps).")
    ] = DEFAULT_H2D_GBPS,
) -> None:
    """Simulate policies on a trace and report JCT, queueing, goodput and SLA attainment per tier."""
    from tidal.sim.experiment import check_policies, prepare, run_policies
    from tidal.sim.report import to_json, write_json, write_plots, write_report
    from tidal.sim.samples import resolve

    given = {"trace": trace, "cluster": cluster}  # as the user named them, for the JSON
    trace, cluster = resolve(trace), resolve(cluster)

    if on_bad_row not in ("skip", "fail"):
        raise ValidationError(f"--on-bad-row must be skip or fail, not {on_bad_row!r}", field="on_bad_row")
    mix_hint = "give three shares, premium,standard,basic: e.g. --tier-mix 0.2,0.3,0.5"
    try:
        mix = tuple(float(x) for x in tier_mix.split(","))
    except ValueError:
        raise ValidationError(f"bad --tier-mix {tier_mix!r}", field="tier_mix", hint=mix_hint) from None
    if len(mix) != 3:
        raise ValidationError("--tier-mix needs three shares", field="tier_mix", hint=mix_hint)
    names = check_policies(policies.split(","))
    from tidal.sim.cost import CostModel

    if not gpu_mem_gb >= 0:
        raise ValidationError(f"--gpu-mem-gb must be 0 or more, not {gpu_mem_gb}", field="gpu_mem_gb")
    for flag, rate in (("d2h", d2h_gbps), ("h2d", h2d_gbps)):
        if not rate > 0:
            raise ValidationError(f"--{flag}-gbps must be above 0, not {rate}", field=f"{flag}_gbps",
                                  hint=f"a copy rate in GB/s, e.g. --{flag}-gbps 20")
    cost = CostModel(gpu_mem_per_rank_gb=gpu_mem_gb, d2h_gbps=d2h_gbps, h2d_gbps=h2d_gbps)
    from tidal.policy.sla_admission import MODES, SlaMode

    if admit_sla not in MODES:
        raise ValidationError(f"--admit-sla must be one of {', '.join(MODES)}, not {admit_sla!r}", field="admit_sla")
    quotas = None
    if quota is not None:
        from tidal.sim.quota_spec import parse_quota_option

        quotas = parse_quota_option(resolve(quota), quota_scale)
    from rich.console import Console  # here: `tidal --help` imports this module, and needs no progress bar
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console(stderr=True)
    t0 = time.monotonic()
    p = prepare(str(trace), cluster, load=load, seed=seed, tier_mix=mix,
                on_bad_row=cast(Literal["skip", "fail"], on_bad_row), fmt=trace_format, limit=limit, quotas=quotas)
    p.sla_mode = cast(SlaMode, admit_sla)
    for line, reason in p.bad_rows[:20]:
        console.print(f"[yellow]skipped bad row[/] line {line}: {reason}", highlight=False)
    if len(p.bad_rows) > 20:
        console.print(f"[yellow]... {len(p.bad_rows) - 20} more bad rows skipped[/]")
    if p.excluded_too_large:
        console.print(f"[yellow]{len(p.excluded_too_large)} jobs larger than their cluster were not simulated[/]"
                      f" (e.g. {', '.join(p.excluded_too_large[:5])})", highlight=False)
    for vc, count in sorted(p.excluded_unknown_vc.items()):
        console.print(f"[yellow]{count} jobs of virtual cluster {vc!r} (not in the cluster file) were not simulated[/]",
                      highlight=False)
    console.print(f"{len(p.jobs)} jobs on {p.cluster.topology.devices} devices, offered load "
                  f"{p.offered_load:.3f} (trace: {p.offered_load_before:.3f})", highlight=False)
    with Progress(TextColumn("{task.description:>18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        tasks = {n: bar.add_task(n, total=len(p.jobs)) for n in names}
        summaries, series = run_policies(
            p, names, cost=cost, workers=workers, progress=lambda n, d: bar.update(tasks[n], completed=d),
            event_log=str(event_log) if event_log is not None else None)
        for n in names:
            bar.update(tasks[n], completed=len(p.jobs))
    elapsed = time.monotonic() - t0
    out = Console(width=max(Console().width, 160))
    table = Table(title=f"{len(p.jobs)} jobs, {p.cluster.topology.devices} devices, load {p.offered_load:.2f}")
    for col in ("policy", "avg JCT (s)", "p99 JCT (s)", "avg queue (s)", "goodput", "alloc", "lost dev-h",
                "idle-wait dev-h", "preempt", "migr", "resize", "premium", "standard", "basic"):
        table.add_column(col, justify="right")
    for n, s in summaries.items():
        sla = s["sla"]
        table.add_row(n, f"{s['avg_jct_s']:.0f}", f"{s['p99_jct_s']:.0f}", f"{s['avg_queue_s']:.0f}",
                      f"{s['goodput']:.3f}", f"{s['allocation']:.3f}", f"{s['lost_device_hours']:.1f}",
                      f"{s['idle_waiting_device_hours']:.1f}", str(s["preemptions"]), str(s["migrations"]),
                      str(s["resizes"]),
                      *(f"{sla[t]['attainment']:.3f}" if t in sla else "-" for t in ("premium", "standard", "basic")))
    out.print(table)
    if quotas is not None:
        for n, s in summaries.items():
            parts = [f"{t} {a['demoted']} of {a['requested']} ({a['demoted_work_fraction']:.1%} of its work), "
                     f"attainment over all that asked {a['requested_attainment']:.3f}"
                     for t, a in s["admission"].items()]
            out.print(f"{n}: admitted as basic (over quota): " + "; ".join(parts), highlight=False)
    if admit_sla != "off":
        for n, s in summaries.items():
            parts = [f"{t}: {a['demoted']} demoted, {a['refused']} refused of {a['requested']}"
                     + (f", {a['deferred']} deferred (mean {a['mean_deferral_s']:.0f} s)" if a["deferred"] else "")
                     for t, a in s["admission"].items()]
            out.print(f"{n}: admission against the load ({admit_sla}): " + "; ".join(parts), highlight=False)
    out.print(f"simulated in {elapsed:.1f} s", highlight=False)
    meta = {**given, "load": load, "seed": seed, "tier_mix": list(mix),
            "quota": quota, "quota_scale": quota_scale, "gpu_mem_gb": gpu_mem_gb, "d2h_gbps": d2h_gbps,
            "h2d_gbps": h2d_gbps,
            "quotas": dict(quotas.shares) if quotas is not None else None, "wall_s": elapsed}
    if json_out is not None:
        write_json(str(json_out), to_json(p, summaries, meta))
    if report is not None:
        write_report(str(report), to_json(p, summaries, meta), summaries, series)
        out.print(f"wrote {report}", highlight=False)
    if plots is not None:
        for path in write_plots(str(plots), summaries, series):
            out.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)
