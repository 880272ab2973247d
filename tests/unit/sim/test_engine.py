"""Hand-made traces whose schedules were computed by hand, for every policy."""

from __future__ import annotations

import pytest

from tidal.core import Tier, Topology
from tidal.policy import Singularity, SingularityConfig, make_policy
from tidal.policy.base import BasePolicy
from tidal.policy.baselines.tiresias import Tiresias
from tidal.sim.cost import CostModel
from tidal.sim.engine import SimJob, Simulator
from tidal.sim.metrics import summarize
from tidal.sim.trace import TraceJob

B, S, P = Tier.BASIC, Tier.STANDARD, Tier.PREMIUM
# A rank's checkpoint and restore each take exactly 1 s; no network time; time-slicing is free.
UNIT = CostModel(mem_per_rank_gb=1.0, dump_gbps=1.0, restore_gbps=1.0, net_gbps_per_node=1e12,
                 cross_region_gbps=1e12, fixed_s=0.0, local_fixed_s=0.0, timeslice_efficiency=1.0,
                 user_checkpoint_s=60.0, restart_s=30.0)


def sim(policy: BasePolicy, nodes: int, per: int, *jobs: tuple[float, float, int, Tier]) -> dict[str, SimJob]:
    trace = [TraceJob(f"j{i}", t, d, w, tier) for i, (t, d, w, tier) in enumerate(jobs)]
    r = Simulator(Topology.uniform(nodes, per), trace, policy, cost=UNIT).run()
    return {j.id: j for j in r.jobs}


def times(js: dict[str, SimJob]) -> dict[str, tuple[float | None, float | None]]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 6)

    return {k: (r(j.first_start), r(j.finish)) for k, j in js.items()}


def test_fifo_head_of_line_blocking() -> None:
    js = sim(make_policy("fifo"), 1, 2, (0, 100, 2, B), (10, 50, 1, B), (20, 10, 1, B))
    assert times(js) == {"j0": (0, 100), "j1": (100, 150), "j2": (100, 110)}


def test_sjf_reorders_by_duration() -> None:
    js = sim(make_policy("sjf"), 1, 1, (0, 100, 1, B), (10, 50, 1, B), (20, 10, 1, B))
    assert times(js) == {"j0": (0, 100), "j2": (100, 110), "j1": (110, 160)}


def test_priority_requeue_kills_and_loses_work_since_the_user_checkpoint() -> None:
    js = sim(make_policy("priority-requeue"), 1, 1, (0, 1000, 1, B), (100, 50, 1, P))
    # b killed at 100: 100 s done, last user checkpoint at 60 s, 40 s lost; restarts at 150 (+30 s).
    assert times(js) == {"j0": (0, 150 + 30 + 940), "j1": (100, 150)}
    assert js["j0"].lost_device_s == pytest.approx(40.0) and js["j0"].preemptions == 1


def test_singularity_preempts_by_checkpoint_and_resumes_without_loss() -> None:
    js = sim(Singularity(SingularityConfig(time_slice=False)), 1, 1, (0, 1000, 1, B), (400, 50, 1, P))
    # b checkpoints 400→401; p starts on the device at 401, ends 451; b restores 451→452, ends 1052.
    assert times(js) == {"j0": (0, 1052), "j1": (400, 451)}
    assert js["j0"].lost_device_s == 0 and js["j0"].preemptions == 1


def test_singularity_minimum_run_time_between_preemptions() -> None:
    js = sim(Singularity(), 1, 1, (0, 1000, 1, B), (100, 50, 1, P), (200, 50, 1, P))
    # b is preempted at 100 (first run: unprotected): checkpoint 100→101, j1 runs 101→151. b resumes
    # at 151 (restore →152). j2 arrives at 200 but b is protected until 151 + 300 = 451: checkpoint
    # 451→452, j2 runs 452→502; b restores 502→503 with 1000 - 100 - 299 = 601 s left → 1104.
    assert times(js) == {"j0": (0, 1104), "j1": (100, 151), "j2": (451, 502)}


def test_singularity_shrinks_a_basic_gang_for_premium() -> None:
    js = sim(Singularity(SingularityConfig(time_slice=False, grow=False)), 1, 2, (0, 1000, 2, B), (400, 100, 1, P))
    # At 400 b (W=2) shrinks to 1 device of its node: checkpoint 2 s (its node's two ranks dump one after
    # the other), restore from the node's images (2 ranks on one device) 2 s, so it computes again from 404 at
    # half speed; 600 s of work left takes 1200 s → 1604. p starts at 402, once the dump is written.
    assert times(js) == {"j0": (0, 1604), "j1": (400, 502)}
    assert js["j0"].resizes == 1


def test_tiresias_demotes_and_preempts_by_attained_service() -> None:
    js = sim(Tiresias(threshold_device_s=100.0), 1, 1, (0, 300, 1, B), (150, 50, 1, B))
    # j0 passes 100 device-s at 100 (queue 1); j1 (queue 0) arrives at 150 and preempts it: checkpoint
    # 150→151, j1 runs 151→201; j0 restores 201→202 and has 150 s left → 352.
    assert times(js) == {"j0": (0, 352), "j1": (150, 201)}


def test_gandiva_time_slices_then_runs_alone() -> None:
    js = sim(make_policy("gandiva"), 1, 1, (0, 100, 1, B), (0, 50, 1, B))
    # Both share the device at half speed: j1 ends at 100, then j0 (50 s left) runs alone → 150.
    assert times(js) == {"j0": (0, 150), "j1": (0, 100)}


def test_metrics_of_a_tiny_run() -> None:
    trace = [TraceJob("a", 0, 100, 1, P), TraceJob("b", 0, 100, 1, B), TraceJob("c", 100, 100, 2, S)]
    r = Simulator(Topology.uniform(1, 2), trace, make_policy("fifo"), cost=UNIT).run()
    s = summarize(r)
    assert s["avg_jct_s"] == pytest.approx(100.0)
    assert s["makespan_s"] == pytest.approx(200.0)
    # Window [0, 100]: 2 devices busy all along → goodput 1.
    assert s["goodput"] == pytest.approx(1.0) and s["allocation"] == pytest.approx(1.0)
    assert s["sla"]["premium"]["attainment"] == 1.0 and s["sla"]["premium"]["met_fraction"] == 1.0


@pytest.mark.parametrize("kwargs", [{"threshold_device_s": 1e9}, {"promote_knob": 1e9},
                                    {"threshold_device_s": 1e-9, "promote_knob": 1e9}])
def test_tiresias_extreme_thresholds_finish_with_a_bounded_series(kwargs: dict[str, float]) -> None:
    # A demotion or promotion timer far past the trace used to grow the plot series one bin per
    # window/200 up to the wake-up (MemoryError); the series now coarsens and the run ends with the jobs.
    trace = [TraceJob("j0", 0, 3000, 1, B), TraceJob("j1", 10, 300, 1, B), TraceJob("j2", 20, 300, 1, B)]
    r = Simulator(Topology.uniform(1, 1), trace, Tiresias(**kwargs), cost=UNIT).run()
    assert all(j.finish is not None for j in r.jobs)
    assert len(r.series_t) <= 800
    last = max(j.finish for j in r.jobs if j.finish is not None)
    assert r.series_t[-1] <= last + (r.series_t[1] - r.series_t[0])
    # The series still accounts for every device-second held, whatever the bin width became: one
    # device, busy from 0 to the last finish (3,600 s of work plus any checkpoint pauses).
    w = r.series_t[1] - r.series_t[0]
    assert sum(r.series_alloc) * w * r.capacity == pytest.approx(last)


def test_idle_while_waiting_counts_free_devices_while_a_gang_waits() -> None:
    # 1 node × 2 devices under FIFO: j0 (1 device, 0→100) leaves one device free while j1 (2 devices,
    # arrived at 10) waits until 100: 90 device-s idle while a job waits; none afterwards.
    trace = [TraceJob("j0", 0, 100, 1, B), TraceJob("j1", 10, 50, 2, B)]
    r = Simulator(Topology.uniform(1, 2), trace, make_policy("fifo"), cost=UNIT).run()
    assert r.idle_waiting_device_s == pytest.approx(90.0)
    s = summarize(r)
    assert s["idle_waiting_device_hours"] == pytest.approx(90.0 / 3600)
    assert s["idle_waiting_fraction"] == pytest.approx(90.0 / (2 * 150))


def test_sla_admission_refuses_or_demotes_what_the_load_cannot_serve() -> None:
    from tidal.policy.sla_admission import SlaAdmission

    # One device: s0 (standard, 1000 s) is admitted; s1 (standard, 100 s) would wait ≈ 1000 s: 0.09 < 0.70.
    trace = [TraceJob("s0", 0, 1000, 1, S), TraceJob("s1", 10, 100, 1, S)]
    log: list[dict[str, object]] = []
    r = Simulator(Topology.uniform(1, 1), trace, make_policy("fifo"), cost=UNIT, log=log.append,
                  sla_admission=SlaAdmission("refuse", 1)).run()
    js = {j.id: j for j in r.jobs}
    assert js["s1"].finish is None and js["s1"].first_start is None
    assert js["s1"].refused.startswith("refused: expected attainment 0.09 at standard")
    assert js["s0"].finish == 1000
    s = summarize(r)
    assert s["jobs"] == 1 and s["admission"]["standard"]["refused"] == 1
    assert [e["kind"] for e in log if e.get("job") == "s1"] == ["job_cancelled"]
    # Demoted instead: it runs, as basic.
    r = Simulator(Topology.uniform(1, 1), trace, make_policy("fifo"), cost=UNIT,
                  sla_admission=SlaAdmission("demote", 1)).run()
    js = {j.id: j for j in r.jobs}
    assert js["s1"].tier is B and js["s1"].requested is S and js["s1"].finish == 1100


def test_sla_admission_defers_until_the_job_ahead_finishes() -> None:
    from tidal.policy.sla_admission import SlaAdmission

    # One device: s0 (standard, 1000 s) runs; s1 (100 s, at 10) would wait ≈ 1000 s (0.09 < 0.70): deferred;
    # s2 (10 s, at 20) is deferred behind s1. s0 finishes at 1000: s1 is released (1.00) and starts; s2 would
    # wait 100 s behind it (10 / 110 = 0.09): still deferred, released when s1 finishes at 1100.
    trace = [TraceJob("s0", 0, 1000, 1, S), TraceJob("s1", 10, 100, 1, S), TraceJob("s2", 20, 10, 1, S)]
    log: list[dict[str, object]] = []
    r = Simulator(Topology.uniform(1, 1), trace, make_policy("fifo"), cost=UNIT, log=log.append,
                  sla_admission=SlaAdmission("defer", 1)).run()
    js = {j.id: j for j in r.jobs}
    assert (js["s1"].tier, js["s1"].first_start, js["s1"].finish, js["s1"].deferred_s) == (S, 1000, 1100, 990)
    assert (js["s2"].tier, js["s2"].first_start, js["s2"].finish, js["s2"].deferred_s) == (S, 1100, 1110, 1080)
    assert js["s1"].queue_s == 990 and js["s2"].queue_s == 1080  # the deferral is queueing: it waited
    assert js["s0"].deferred_s is None and js["s0"].finish == 1000
    deferred = [e for e in log if e.get("kind") == "job_deferred"]
    assert [e["job"] for e in deferred] == ["s1", "s2"]
    assert deferred[0]["detail"] == ("deferred: expected attainment 0.09 at standard under the current load, "
                                     "below its target 0.70; it starts when that is met")
    released = [e for e in log if e.get("kind") == "job_submitted" and e.get("job") in ("s1", "s2")]
    assert [(e["job"], e["time"], e["detail"]) for e in released] == [
        ("s1", 1000, "released: expected attainment now 1.00 ≥ 0.70"),
        ("s2", 1100, "released: expected attainment now 1.00 ≥ 0.70")]
    a = summarize(r)["admission"]["standard"]
    assert (a["requested"], a["deferred"], a["mean_deferral_s"], a["demoted"], a["refused"]) == (3, 2, 1035, 0, 0)
