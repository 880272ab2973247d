"""One simulation experiment: load a trace, fit it to a cluster, run policies, summarise.

Jobs that cannot run at all are reported, never silently dropped: jobs larger than the whole cluster
(or than their pinned virtual cluster), and jobs of virtual clusters missing from the cluster file.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue as queue_mod
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tidal.errors import ValidationError
from tidal.policy.admission import Admission, Quotas
from tidal.policy.registry import POLICIES, make_policy
from tidal.policy.sla_admission import SlaAdmission, SlaMode
from tidal.sim.cluster_spec import ClusterSpec, parse_cluster
from tidal.sim.cost import CostModel
from tidal.sim.engine import SimResult, Simulator
from tidal.sim.metrics import summarize
from tidal.sim.trace import OnBadRow, TraceJob, assign_tiers, load_trace, offered_load, rescale_load


@dataclasses.dataclass
class Prepared:
    jobs: list[TraceJob]
    cluster: ClusterSpec
    excluded_too_large: list[str]
    excluded_unknown_vc: dict[str, int]
    bad_rows: list[tuple[int, str]]
    offered_load_before: float
    offered_load: float
    trace_jobs: int
    quotas: Quotas | None = None  # premium and standard admitted against these
    sla_mode: SlaMode = "off"  # guaranteed jobs whose SLA the load makes unreachable: demoted, refused, deferred

    def admission(self) -> Admission | None:
        """A fresh admission for one run (it tracks that run's unfinished jobs)."""
        return None if self.quotas is None else Admission(self.quotas, self.cluster.topology.devices)

    def sla_admission(self) -> SlaAdmission | None:
        """A fresh SLA admission for one run, or None when it is off."""
        return None if self.sla_mode == "off" else SlaAdmission(self.sla_mode, self.cluster.topology.devices)


def prepare(
    trace: str,
    cluster: str,
    *,
    load: float | None = None,
    seed: int = 0,
    tier_mix: tuple[float, float, float] = (0.2, 0.3, 0.5),
    on_bad_row: OnBadRow = "skip",
    fmt: str = "auto",
    limit: int | None = None,
    gavel_step_s: float = 1.0,
    quotas: Quotas | None = None,
) -> Prepared:
    tr = load_trace(trace, fmt=fmt, on_bad_row=on_bad_row, gavel_step_s=gavel_step_s)
    spec = parse_cluster(cluster)
    jobs = tr.jobs[:limit] if limit else tr.jobs
    jobs = assign_tiers(jobs, seed=seed, mix=tier_mix)
    sizes = {c.name: c.devices for c in spec.topology.clusters()}
    biggest = max(sizes.values())
    kept: list[TraceJob] = []
    too_large: list[str] = []
    unknown: dict[str, int] = {}
    for j in jobs:
        if spec.pinned:
            if j.project not in sizes:
                unknown[j.project] = unknown.get(j.project, 0) + 1
                continue
            if j.gpus > sizes[j.project]:
                too_large.append(j.id)
                continue
        elif j.gpus > biggest:
            too_large.append(j.id)
            continue
        kept.append(j)
    if not kept:
        raise ValidationError("no job of the trace can run on this cluster", field="cluster",
                              hint="give --cluster nodes (or virtual clusters) large enough for the trace's jobs")
    cap = spec.topology.devices
    before = offered_load(kept, cap)
    if load is not None:
        kept = rescale_load(kept, cap, load)
    return Prepared(kept, spec, too_large, unknown, [(b.line, b.reason) for b in tr.bad_rows], before,
                    offered_load(kept, cap), len(tr.jobs), quotas)


def check_policies(names: Sequence[str]) -> list[str]:
    out = []
    for n in names:
        n = n.strip()
        if not n:
            continue
        make_policy(n)  # raises with the list of valid names
        out.append(n)
    if not out:
        raise ValidationError("no policy given", field="policies", hint="valid policies: " + ", ".join(POLICIES))
    return out


def run_one(p: Prepared, name: str, cost: CostModel | None = None,
            progress: Callable[[int], None] | None = None, event_log: str | None = None) -> SimResult:
    """Simulate one policy; ``event_log``: a directory to write ``<policy>.jsonl`` into (every event
    and action, in the log format the live control plane uses too)."""
    if event_log is None:
        sim = Simulator(p.cluster.topology, p.jobs, make_policy(name), cost=cost, pinned=p.cluster.pinned,
                        admission=p.admission(), sla_admission=p.sla_admission())
        return sim.run(progress)
    os.makedirs(event_log, exist_ok=True)
    with open(os.path.join(event_log, f"{name}.jsonl"), "w", encoding="utf-8") as f:

        def write(rec: dict[str, Any]) -> None:
            f.write(json.dumps(rec) + "\n")

        sim = Simulator(p.cluster.topology, p.jobs, make_policy(name), cost=cost, pinned=p.cluster.pinned,
                        log=write, admission=p.admission(), sla_admission=p.sla_admission())
        return sim.run(progress)


def _bind(progress: Callable[[str, int], None] | None, name: str) -> Callable[[int], None] | None:
    if progress is None:
        return None
    return lambda done: progress(name, done)


def _series(r: SimResult) -> dict[str, Any]:
    jct = sorted(float(j.finish) - j.submit for j in r.jobs if j.finish is not None)
    return {"t": r.series_t, "goodput": r.series_good, "allocation": r.series_alloc, "jct_sorted": jct,
            "window": list(r.window)}


def _worker(p: Prepared, name: str, cost: CostModel | None, q: Any,
            event_log: str | None = None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    last = [0]

    def tick(done: int) -> None:
        if done - last[0] >= 500:
            q.put((name, done))
            last[0] = done

    r = run_one(p, name, cost, tick, event_log)
    q.put((name, len(r.jobs)))
    return name, summarize(r), _series(r)


# Relative simulation effort per policy (CPU time on the Philly trace), for scheduling the runs.
_EFFORT = {"tiresias": 10, "srtf": 8, "gandiva": 5, "singularity": 4, "priority-requeue": 3, "sjf": 1, "fifo": 1}


def run_policies(
    p: Prepared,
    names: Sequence[str],
    *,
    cost: CostModel | None = None,
    workers: int | None = None,
    progress: Callable[[str, int], None] | None = None,
    event_log: str | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Run each policy on the same jobs; in parallel processes (one a core) when there are several."""
    workers = workers or min(len(names), os.cpu_count() or 1)
    summaries: dict[str, dict[str, Any]] = {}
    series: dict[str, dict[str, Any]] = {}
    if workers <= 1 or len(names) == 1:
        for n in names:
            r = run_one(p, n, cost, _bind(progress, n), event_log)
            summaries[n], series[n] = summarize(r), _series(r)
        return summaries, series
    ctx = multiprocessing.get_context("fork")
    mgr = ctx.Manager()
    q = mgr.Queue()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            try:
                name, done = q.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if progress is not None:
                progress(name, done)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        with ctx.Pool(workers) as pool:
            # Longest first, so that the slowest policy does not start last on a busy worker.
            order = sorted(names, key=lambda n: -_EFFORT.get(n, 1))
            results = [pool.apply_async(_worker, (p, n, cost, q, event_log)) for n in order]
            for res in results:
                name, summ, ser = res.get()
                summaries[name], series[name] = summ, ser
    finally:
        stop.set()
        th.join()
        mgr.shutdown()
    return {n: summaries[n] for n in names}, {n: series[n] for n in names}
