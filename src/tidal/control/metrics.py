"""The control plane's Prometheus metrics (docs/metrics.md lists each one): a custom collector that reads the
database at each scrape.

Gauges are read live, with bounded queries (live jobs by the state index, the nodes, the folded jobs of the
SLA window). Counters and histograms of what happened are the event log's, folded by
:mod:`tidal.control.tally` into rows at each scrape before they are read: they are the database's, not this
process's, so a restart of the control plane resets none of them. The API's request latency is this
process's own (:mod:`tidal.control.api.latency`): a latency histogram that restarts with the process, as
Prometheus's ``rate()`` expects of one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tidal.control import jobs, linkrates, tally
from tidal.control.clock import now
from tidal.control.store.db import Database
from tidal.control.store.models import EventRow, JobRow, MetricRow, NodeRow
from tidal.core import TERMINAL, JobState, Tier
from tidal.sim.metrics import weighted_attainment

log = logging.getLogger(__name__)

TIERS = tuple(t.value for t in (Tier.PREMIUM, Tier.STANDARD, Tier.BASIC))
LIVE_STATES = tuple(st.value for st in JobState if st not in TERMINAL)

#: Help texts of the folded series (docs/metrics.md says more).
FOLDED_HELP: dict[str, str] = {
    "tidal_jobs_submitted_total": "Jobs submitted, by the tier they were admitted at.",
    "tidal_jobs_finished_total": "Jobs that ended, by tier and final state (succeeded, failed, cancelled).",
    "tidal_preemptions_total": "Jobs checkpointed and stopped, by tier and cause (user, scheduler, "
                               "migration_target_lost).",
    "tidal_migrations_total": "Migrations committed (checkpointed, to be restored elsewhere), by tier and cause "
                              "(user, scheduler).",
    "tidal_resizes_total": "Resizes committed (checkpointed, to be restored on other devices), by tier and cause.",
    "tidal_restarts_total": "Jobs requeued after a failure of their own, counted against max_restarts, by tier "
                            "and cause (restore_failed, killed, other).",
    "tidal_requeues_total": "Jobs requeued without counting a restart (nothing of theirs failed), by tier and cause "
                            "(node_lost, checkpoint_bad, store_unreachable, other).",
    "tidal_checkpoints_total": "Checkpoints committed, by tier and purpose.",
    "tidal_checkpoint_failures_total": "Checkpoints that did not commit, by tier, purpose and cause (error: the "
                                       "agents reported it failed, the job goes on; job_lost: the job's ranks or "
                                       "node were lost meanwhile).",
    "tidal_checkpoints_bad_total": "Checkpoints found damaged when restored (marked bad), by tier.",
    "tidal_lease_losses_total": "Node leases lost, by cause (expired, agent_left, agent_replaced, other).",
    "tidal_node_drains_total": "Nodes drained, by cause (lease_losses: its lease lost too often; admin).",
    "tidal_job_queueing_seconds": "Time from a job's submission to its first start, by tier.",
    "tidal_checkpoint_pause_seconds": "Time from the start of a checkpoint to its commit, by tier and purpose.",
    "tidal_checkpoint_size_bytes": "Logical size of each committed checkpoint, by tier.",
    "tidal_checkpoint_stored_bytes": "New bytes the checkpoint store wrote for each committed checkpoint, by tier.",
    "tidal_restore_seconds": "Time from the start of a restore to the job running again, by tier.",
    "tidal_migration_seconds": "Time from the start of a migration's checkpoint to the job running at its "
                               "destination, by tier.",
}
#: The labels of each folded series, in order (the rows hold them as JSON).
FOLDED_LABELS: dict[str, tuple[str, ...]] = {
    "tidal_jobs_submitted_total": ("tier",),
    "tidal_jobs_finished_total": ("tier", "state"),
    "tidal_preemptions_total": ("tier", "cause"),
    "tidal_migrations_total": ("tier", "cause"),
    "tidal_resizes_total": ("tier", "cause"),
    "tidal_restarts_total": ("tier", "cause"),
    "tidal_requeues_total": ("tier", "cause"),
    "tidal_checkpoints_total": ("tier", "purpose"),
    "tidal_checkpoint_failures_total": ("tier", "purpose", "cause"),
    "tidal_checkpoints_bad_total": ("tier",),
    "tidal_lease_losses_total": ("cause",),
    "tidal_node_drains_total": ("cause",),
    "tidal_job_queueing_seconds": ("tier",),
    "tidal_checkpoint_pause_seconds": ("tier", "purpose"),
    "tidal_checkpoint_size_bytes": ("tier",),
    "tidal_checkpoint_stored_bytes": ("tier",),
    "tidal_restore_seconds": ("tier",),
    "tidal_migration_seconds": ("tier",),
}


def fold(db: Database, budget_s: float = tally.FOLD_BUDGET_S) -> None:
    """Fold the events not yet folded, a batch per transaction, until caught up or ``budget_s`` is spent (a
    backlog left over is folded at the next scrapes)."""
    deadline = time.monotonic() + budget_s
    while True:
        with db.tx(notify=False) as s:
            n = tally.fold(s)
        if n < tally.FOLD_BATCH or time.monotonic() >= deadline:
            return


class TidalCollector(Collector):
    """Every metric of the control plane whose value is in the database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Any]:
        fold(self.db)
        with self.db.read() as s:
            yield from self._folded(s)
            yield from self._jobs(s)
            yield from self._devices_and_nodes(s)
            yield from self._links(s)
            yield from self._sla(s)
            yield from self._progress(s)
            seq = s.scalar(select(func.max(EventRow.seq))) or 0
            folded = tally.folded_seq(s)
        g = GaugeMetricFamily("tidal_events_unfolded", "Events recorded but not yet folded into the counters "
                                                       "(a backlog is folded over the next scrapes).")
        g.add_metric([], float(max(0, seq - folded)))
        yield g

    # -- what happened: the folded series ----------------------------------------------------------------
    def _folded(self, s: Session) -> Iterator[Any]:
        rows: dict[str, list[MetricRow]] = {name: [] for name in FOLDED_HELP}
        for r in tally.series(s):
            if r.name in rows:
                rows[r.name].append(r)
        for name, help_ in FOLDED_HELP.items():
            names = FOLDED_LABELS[name]
            if name in tally.HISTOGRAMS:
                bounds = tally.HISTOGRAMS[name]
                h = HistogramMetricFamily(name, help_, labels=names)
                for r in rows[name]:
                    lab = json.loads(r.labels)
                    counts = list(r.data.get("b") or [])
                    cumulative, acc = [], 0.0
                    for k, le in enumerate((*(repr(b) for b in bounds), "+Inf")):
                        acc += float(counts[k]) if k < len(counts) else 0.0
                        cumulative.append((le, acc))
                    h.add_metric([lab.get(n, "") for n in names], cumulative, float(r.data.get("s", 0.0)))
                yield h
            else:
                c = CounterMetricFamily(name, help_, labels=names)
                for r in rows[name]:
                    lab = json.loads(r.labels)
                    c.add_metric([lab.get(n, "") for n in names], float(r.data.get("v", 0.0)))
                yield c

    # -- what is: live gauges -----------------------------------------------------------------------------
    def _jobs(self, s: Session) -> Iterator[Any]:
        counts = {(st, t): 0 for st in LIVE_STATES for t in TIERS}
        q = (select(JobRow.state, JobRow.tier, func.count()).where(JobRow.state.in_(LIVE_STATES))
             .group_by(JobRow.state, JobRow.tier))
        for st, t, n in s.execute(q):
            counts[(st, t)] = int(n)
        g = GaugeMetricFamily("tidal_jobs", "Jobs not yet ended, by state and tier (ended jobs: "
                                            "tidal_jobs_finished_total).", labels=("state", "tier"))
        for (st, t), n in sorted(counts.items()):
            g.add_metric([st, t], float(n))
        yield g

    def _devices_and_nodes(self, s: Session) -> Iterator[Any]:
        nodes = list(s.scalars(select(NodeRow).order_by(NodeRow.name)))
        up = {n.name: n for n in nodes if n.up}
        used: dict[str, dict[str, int]] = {n: {} for n in up}  # node → tier → devices held
        tiers = dict.fromkeys(TIERS, 0)
        active = [st.value for st in jobs.ACTIVE]
        for j in s.scalars(select(JobRow).where(JobRow.state.in_(active))):
            for d in {(d.node, d.index) for d in jobs.held_devices(j)}:
                if d[0] in up:
                    used[d[0]][j.tier] = used[d[0]].get(j.tier, 0) + 1
                    tiers[j.tier] = tiers.get(j.tier, 0) + 1
        total = sum(node.devices for node in up.values())
        busy = sum(tiers.values())
        g = GaugeMetricFamily("tidal_devices", "Devices of the nodes that are up.")
        g.add_metric([], float(total))
        yield g
        g = GaugeMetricFamily("tidal_devices_used", "Devices held by jobs (running, or reserved for a "
                                                    "migration's destination), by the job's tier.", labels=("tier",))
        for t, n in sorted(tiers.items()):
            g.add_metric([t], float(n))
        yield g
        g = GaugeMetricFamily("tidal_devices_idle", "Devices of nodes that are up that no job holds.")
        g.add_metric([], float(max(0, total - busy)))
        yield g
        up_g = GaugeMetricFamily("tidal_node_up", "1 while the node's agent holds its lease, else 0.",
                                 labels=("node", "region", "cluster"))
        dev_g = GaugeMetricFamily("tidal_node_devices", "Devices of the node.", labels=("node",))
        used_g = GaugeMetricFamily("tidal_node_devices_used", "Devices of the node held by jobs, by tier.",
                                   labels=("node", "tier"))
        lease_g = GaugeMetricFamily("tidal_node_lease_remaining_seconds", "Time left on the node's lease.",
                                    labels=("node",))
        renew = CounterMetricFamily("tidal_lease_renewals_total", "Heartbeats that renewed the node's lease.",
                                    labels=("node",))
        drained_g = GaugeMetricFamily("tidal_node_drained", "1 while the node is drained (it takes no new job: its "
                                      "lease was lost too often, or an admin drained it), else 0.", labels=("node",))
        at = now(s)
        for node in nodes:
            up_g.add_metric([node.name, node.region, node.cluster], 1.0 if node.up else 0.0)
            drained_g.add_metric([node.name], 1.0 if node.drain else 0.0)
            dev_g.add_metric([node.name], float(node.devices))
            lease_g.add_metric([node.name], max(0.0, node.lease_until - at) if node.up else 0.0)
            renew.add_metric([node.name], float(node.lease_renewals or 0))
            for t, k in sorted(used.get(node.name, {}).items()):
                used_g.add_metric([node.name, t], float(k))
        yield from (up_g, dev_g, used_g, lease_g, renew, drained_g)

    def _links(self, s: Session) -> Iterator[Any]:
        g = GaugeMetricFamily("tidal_region_link_gbps", "The measured rate of the link from one region's checkpoint "
                              "store to another's, GB/s: the median of the last copies of 64 MiB or more.",
                              labels=("from", "to"))
        for (a, b), rate in sorted(linkrates.measured(s).items()):
            g.add_metric([a, b], rate)
        yield g

    def _sla(self, s: Session) -> Iterator[Any]:
        att = GaugeMetricFamily("tidal_sla_attainment", "SLA attainment per tier, as the simulator defines it: "
                                "Σ W·T_ideal / Σ W·T_real over live jobs that have started and jobs ended within "
                                "the last hour (T_ideal: time running; T_real: since submission).",
                                labels=("tier",))
        target = GaugeMetricFamily("tidal_sla_target", "The tier's SLA attainment target.", labels=("tier",))
        count = GaugeMetricFamily("tidal_sla_jobs", "Jobs the SLA attainment of the tier is over.",
                                  labels=("tier",))
        groups = tally.by_tier(tally.sla_jobs(s, now(s)))
        for t in TIERS:
            items = groups.get(t, [])
            count.add_metric([t], float(len(items)))
            if items:
                att.add_metric([t], weighted_attainment((j.ranks, j.ideal, j.real) for j in items))
            goal = Tier(t).target
            if goal is not None:
                target.add_metric([t], goal)
        yield from (att, target, count)

    def _progress(self, s: Session) -> Iterator[Any]:
        """What the agents report of each job's ranks in their heartbeats, per node."""
        labels = ("node", "job_id", "tier")  # not "job": Prometheus gives every series the scrape job's
        cpu = CounterMetricFamily("tidal_job_cpu_seconds", "CPU time of the job's ranks on the node, this "
                                  "attempt (it starts again at a restore).", labels=labels)
        rss = GaugeMetricFamily("tidal_job_memory_rss_bytes", "Resident memory of the job's ranks on the node.",
                                labels=labels)
        gpu = GaugeMetricFamily("tidal_job_gpu_rank_memory_bytes", "GPU memory of the job's largest rank on the "
                                "node (NVML's figure, CUDA's context included), on GPU nodes.", labels=labels)
        steps = GaugeMetricFamily("tidal_job_steps", "Training steps of the job's furthest rank on the node.",
                                  labels=labels)
        rate = GaugeMetricFamily("tidal_job_steps_per_second", "Training steps per second of the job's ranks on "
                                 "the node.", labels=labels)
        node_rss = GaugeMetricFamily("tidal_node_memory_rss_bytes", "Resident memory of every job's ranks on the "
                                     "node.", labels=("node",))
        node_rss_sum: dict[str, float] = {}
        active = [st.value for st in jobs.ACTIVE]
        for j in s.scalars(select(JobRow).where(JobRow.state.in_(active))):
            here = {p["node"] for p in j.placement}
            for node, v in sorted(((j.progress or {}).get("nodes") or {}).items()):
                if node not in here or not isinstance(v, dict):
                    continue
                lab = [node, j.id, j.tier]
                if "cpu_s" in v:
                    cpu.add_metric(lab, float(v["cpu_s"]))
                if "rss_bytes" in v:
                    rss.add_metric(lab, float(v["rss_bytes"]))
                    node_rss_sum[node] = node_rss_sum.get(node, 0.0) + float(v["rss_bytes"])
                if "gpu_rank_bytes" in v:
                    gpu.add_metric(lab, float(v["gpu_rank_bytes"]))
                if "steps" in v:
                    steps.add_metric(lab, float(v["steps"]))
                if "steps_per_s" in v:
                    rate.add_metric(lab, float(v["steps_per_s"]))
        for node, b in sorted(node_rss_sum.items()):
            node_rss.add_metric([node], b)
        yield from (cpu, rss, gpu, steps, rate, node_rss)
