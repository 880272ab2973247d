"""Every policy step on small hand-made views, with the exact actions expected."""

from __future__ import annotations

from tidal.core import (
    ActionKind,
    ClusterView,
    DeviceRef,
    Event,
    EventKind,
    JobState,
    JobView,
    Tier,
    Topology,
    rank_map,
)
from tidal.policy import Singularity, SingularityConfig, make_policy
from tidal.policy.baselines.priority_requeue import PriorityRequeue
from tidal.policy.baselines.tiresias import Tiresias

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC
NOW = 10_000.0


def run(jid: str, w: int, tier: Tier, devs: list[tuple[int, int]], *, started: float = 0.0,
        project: str = "default", attained: float = 0.0, submitted: float = 0.0) -> JobView:
    d = tuple(DeviceRef(f"c0-n{n}", i) for n, i in devs)
    return JobView(jid, w, tier, submitted, JobState.RUNNING, project=project, placement=rank_map(d, w),
                   started_at=started, attained_device_s=attained)


def pend(jid: str, w: int, tier: Tier, *, submitted: float = 1.0, project: str = "default") -> JobView:
    return JobView(jid, w, tier, submitted, project=project)


def view(nodes: int, per: int, *jobs: JobView) -> ClusterView:
    return ClusterView(Topology.uniform(nodes, per), {j.id: j for j in jobs})


def summary(actions: list) -> list[tuple[str, str, list[tuple[str, int]]]]:  # type: ignore[type-arg]
    return [(a.kind.value, a.job_id, [(d.node, d.index) for d in a.devices]) for a in actions]


def test_placement_is_best_fit_on_one_node() -> None:
    v = view(2, 4, run("r", 3, B, [(0, 0), (0, 1), (0, 2)]), pend("a", 1, B), pend("b", 4, B, submitted=2))
    assert summary(Singularity().decide(v, [], NOW)) == [
        ("place", "a", [("c0-n0", 3)]),
        ("place", "b", [("c0-n1", i) for i in range(4)]),
    ]


def test_large_gang_takes_whole_nodes_plus_best_fit_remainder() -> None:
    v = view(3, 4, run("r", 1, B, [(2, 0)]), pend("g", 6, B))
    (a,) = Singularity().decide(v, [], NOW)
    assert a.kind is ActionKind.PLACE
    assert [(d.node, d.index) for d in a.devices] == [("c0-n0", i) for i in range(4)] + [("c0-n2", 1), ("c0-n2", 2)]


def test_preemption_takes_lowest_tier_most_recent_first() -> None:
    v = view(1, 3,
             run("std", 1, S, [(0, 0)], started=0.0),
             run("old", 1, B, [(0, 1)], started=0.0),
             run("new", 1, B, [(0, 2)], started=100.0),
             pend("p", 1, P))
    assert summary(Singularity().decide(v, [], NOW)) == [
        ("preempt", "new", []),
        ("place", "p", [("c0-n0", 2)]),
    ]


def test_shrink_before_preempt() -> None:
    v = view(1, 4, run("b", 4, B, [(0, 0), (0, 1), (0, 2), (0, 3)]), pend("p", 2, P))
    acts = Singularity().decide(v, [], NOW)
    assert summary(acts) == [
        ("resize", "b", [("c0-n0", 0), ("c0-n0", 1)]),
        ("place", "p", [("c0-n0", 2), ("c0-n0", 3)]),
    ]
    assert acts[0].live_executable and acts[1].live_executable


def test_minimum_run_time_protects_a_resumed_job_and_asks_for_a_wakeup() -> None:
    pol = Singularity()
    # b was preempted once and resumed 10 s ago: protected until 300 s after its resume.
    v0 = view(1, 1, JobView("b", 1, B, 0.0, JobState.PREEMPTED, attained_device_s=100.0))
    assert summary(pol.decide(v0, [], NOW - 10)) == [("resume", "b", [("c0-n0", 0)])]
    v1 = view(1, 1, run("b", 1, B, [(0, 0)], started=NOW - 10), pend("p", 1, P, submitted=NOW))
    assert pol.decide(v1, [Event("e1", NOW, EventKind.JOB_SUBMITTED, job_id="p")], NOW) == []
    assert pol.next_wakeup(NOW) == NOW - 10 + 300


def test_a_job_on_its_first_run_is_not_protected() -> None:
    v = view(1, 1, run("b", 1, B, [(0, 0)], started=NOW - 10), pend("p", 1, P))
    assert [a.kind for a in Singularity().decide(v, [], NOW)] == [ActionKind.PREEMPT, ActionKind.PLACE]


def test_never_preempts_a_higher_or_equal_tier() -> None:
    v = view(1, 2, run("p1", 1, P, [(0, 0)]), run("s1", 1, S, [(0, 1)]), pend("s2", 1, S), pend("b", 1, B))
    acts = Singularity(SingularityConfig(time_slice=False)).decide(v, [], NOW)
    assert acts == []


def test_growth_into_idle_devices() -> None:
    v = view(1, 4, run("b", 4, B, [(0, 0), (0, 1)]))
    assert summary(Singularity().decide(v, [], NOW)) == [
        ("resize", "b", [("c0-n0", i) for i in range(4)]),
    ]


def test_defragmentation_migrates_a_small_job_so_a_gang_fits() -> None:
    v = view(2, 2, run("x", 1, B, [(0, 0)]), run("y", 1, B, [(1, 0)]), pend("g", 2, B))
    acts = summary(Singularity(SingularityConfig(elastic_start_fraction=1.0)).decide(v, [], NOW))
    assert acts == [
        ("migrate", "x", [("c0-n1", 1)]),
        ("place", "g", [("c0-n0", 0), ("c0-n0", 1)]),
    ]


def test_time_slice_when_oversubscribed_then_unshare_when_free() -> None:
    v = view(1, 1, run("a", 1, B, [(0, 0)]), pend("b", 1, B))
    pol = Singularity(SingularityConfig(time_slice=True))
    assert summary(pol.decide(v, [], NOW)) == [("time_slice", "b", [("c0-n0", 0)])]
    # Job a finishes: b keeps its device alone (no action needed), and is no longer shared.
    done = Event("e1", NOW + 50, EventKind.JOB_FINISHED, job_id="a")
    v2 = ClusterView(v.topology, {"b": run("b", 1, B, [(0, 0)], started=NOW)})
    assert pol.decide(v2, [done], NOW + 50) == []
    assert pol.st is not None and not pol.st.jobs["b"].shared


def test_fair_share_between_projects_within_a_tier() -> None:
    v = view(1, 3,
             run("r1", 1, S, [(0, 0)], project="p1"), run("r2", 1, S, [(0, 1)], project="p1"),
             pend("a", 1, S, submitted=1.0, project="p1"), pend("b", 1, S, submitted=2.0, project="p2"))
    acts = summary(Singularity(SingularityConfig(time_slice=False)).decide(v, [], NOW))
    assert acts == [("place", "b", [("c0-n0", 2)])]


def test_quota_limits_preemption_by_guaranteed_tiers() -> None:
    v = view(1, 2, run("g", 1, P, [(0, 0)], project="q"), run("b", 1, B, [(0, 1)]), pend("p", 1, P, project="q"))
    limited = Singularity(SingularityConfig(quotas={"q": 0.5}, time_slice=False))
    assert limited.decide(v, [], NOW) == []
    free = Singularity(SingularityConfig(quotas={"q": 1.0}, time_slice=False))
    assert [a.kind for a in free.decide(v, [], NOW)] == [ActionKind.PREEMPT, ActionKind.PLACE]


def test_incremental_arrival_matches_exact_actions() -> None:
    pol = Singularity()
    v0 = view(1, 2, run("b", 1, B, [(0, 0)]))
    assert pol.decide(v0, [], NOW) == []
    v1 = view(1, 2, run("b", 1, B, [(0, 0)]), pend("p", 2, P, submitted=NOW))
    acts = pol.decide(v1, [Event("e7", NOW, EventKind.JOB_SUBMITTED, job_id="p")], NOW)
    assert summary(acts) == [("preempt", "b", []), ("place", "p", [("c0-n0", 0), ("c0-n0", 1)])]
    assert all(a.cause == "e7" for a in acts)
    assert len({a.id for a in acts}) == 2


def test_fifo_blocks_at_the_head_of_the_line() -> None:
    v = view(1, 2, run("r", 1, B, [(0, 0)]), pend("big", 2, B, submitted=1), pend("small", 1, B, submitted=2))
    assert make_policy("fifo").decide(v, [], NOW) == []


def test_sjf_orders_by_oracle_duration() -> None:
    a = JobView("long", 1, B, 1.0, duration_hint=100.0)
    b = JobView("short", 1, B, 2.0, duration_hint=10.0)
    v = view(1, 1, a, b)
    assert summary(make_policy("sjf").decide(v, [], NOW)) == [("place", "short", [("c0-n0", 0)])]


def test_priority_requeue_kills_lowest_priority_without_protection() -> None:
    v = view(1, 1, run("b", 1, B, [(0, 0)], started=NOW - 1), pend("p", 1, P))
    acts = PriorityRequeue().decide(v, [], NOW)
    assert [(a.kind, a.job_id, a.kill) for a in acts] == [
        (ActionKind.PREEMPT, "b", True), (ActionKind.PLACE, "p", False)]
    assert not acts[0].live_executable


def test_tiresias_top_queue_preempts_lower_queue() -> None:
    v = view(1, 1, run("old", 1, B, [(0, 0)], started=0.0, attained=5000.0), pend("new", 1, B, submitted=5))
    acts = Tiresias().decide(v, [], NOW)
    assert summary(acts) == [("preempt", "old", []), ("place", "new", [("c0-n0", 0)])]


def test_tiresias_same_queue_does_not_preempt() -> None:
    v = view(1, 1, run("a", 1, B, [(0, 0)], started=NOW - 10), pend("b", 1, B, submitted=5))
    assert Tiresias().decide(v, [], NOW) == []


def test_gandiva_time_slices_regardless_of_tier() -> None:
    v = view(1, 1, run("a", 1, P, [(0, 0)]), pend("b", 1, B))
    assert summary(make_policy("gandiva").decide(v, [], NOW)) == [("time_slice", "b", [("c0-n0", 0)])]


def test_srtf_preempts_the_longest_remaining() -> None:
    long = JobView("long", 1, B, 0.0, JobState.RUNNING, placement=(DeviceRef("c0-n0", 0),), started_at=NOW,
                   duration_hint=1000.0, remaining_hint=1000.0)
    short = JobView("short", 1, B, 5.0, duration_hint=10.0, remaining_hint=10.0)
    v = view(1, 1, long, short)
    assert summary(make_policy("srtf").decide(v, [], NOW)) == [
        ("preempt", "long", []), ("place", "short", [("c0-n0", 0)])]


def test_a_waiting_guaranteed_gang_reserves_a_node() -> None:
    # Premium jobs on both nodes: no room by preemption, and defragmentation may not move them.
    v = view(2, 2, run("s0", 1, P, [(0, 0)]), run("s1", 1, P, [(1, 0)]), pend("g", 2, S, submitted=1),
             pend("x", 1, B, submitted=2))
    pol = Singularity()
    acts = pol.decide(v, [], NOW)
    (node,) = pol.reservations.by_job["g"][1]
    other = 1 - int(node[-1])
    # The basic job may not take the reserved node's free device, only the other node's.
    assert summary(acts) == [("place", "x", [(f"c0-n{other}", 1)])]
    # When the premium job on the reserved node finishes, g gets the node at once.
    done = Event("e1", NOW + 1, EventKind.JOB_FINISHED, job_id=f"s{node[-1]}")
    v2 = view(2, 2, run(f"s{other}", 1, P, [(other, 0)]), run("x", 1, B, [(other, 1)]), pend("g", 2, S, submitted=1))
    assert summary(pol.decide(v2, [done], NOW + 1)) == [("place", "g", [(node, 0), (node, 1)])]
    assert "g" not in pol.reservations.by_job


def test_short_lane_goes_before_waiting_standard_within_its_share() -> None:
    # One free device for the lane (share 1/3 of 3): b1 takes it ahead of s1; b2 would exceed the share and
    # waits with the other basic work; s1 takes the last free device.
    cfg = SingularityConfig(short_lane_device_s=3600.0, short_lane_share=1 / 3)
    v = view(1, 3, run("s0", 1, S, [(0, 0)]),
             pend("s1", 1, S, submitted=1.0), pend("b1", 1, B, submitted=2.0), pend("b2", 1, B, submitted=3.0))
    pol = Singularity(cfg)
    assert summary(pol.decide(v, [], NOW)) == [
        ("place", "b1", [("c0-n0", 1)]),
        ("place", "s1", [("c0-n0", 2)]),
    ]
    # A new standard job may not preempt the lane's job; a premium one may.
    jobs = {"s0": run("s0", 1, S, [(0, 0)]), "b1": run("b1", 1, B, [(0, 1)], started=NOW),
            "s1": run("s1", 1, S, [(0, 2)], started=NOW), "b2": pend("b2", 1, B, submitted=3.0)}
    v2 = ClusterView(v.topology, {**jobs, "s2": pend("s2", 1, S, submitted=NOW + 1)})
    assert pol.decide(v2, [Event("e1", NOW + 1, EventKind.JOB_SUBMITTED, job_id="s2")], NOW + 1) == []
    v3 = ClusterView(v.topology, {**jobs, "s2": pend("s2", 1, S, submitted=NOW + 1),
                                  "p": pend("p", 1, P, submitted=NOW + 2)})
    assert summary(pol.decide(v3, [Event("e2", NOW + 2, EventKind.JOB_SUBMITTED, job_id="p")], NOW + 2)) == [
        ("preempt", "b1", []),
        ("place", "p", [("c0-n0", 1)]),
    ]


def test_short_lane_is_rebuilt_from_the_view() -> None:
    # After a rebuild the lane holds the short basic jobs, oldest start first, up to its share.
    cfg = SingularityConfig(short_lane_device_s=3600.0, short_lane_share=1 / 3)
    v = view(1, 3, run("a", 1, B, [(0, 0)], started=NOW - 20), run("b", 1, B, [(0, 1)], started=NOW - 10),
             run("long", 1, B, [(0, 2)], started=NOW - 30, attained=4000.0), pend("s", 1, S))
    pol = Singularity(cfg)
    assert summary(pol.decide(v, [], NOW)) == [("preempt", "b", []), ("place", "s", [("c0-n0", 1)])]
    assert list(pol.lane_held) == ["a"]


def test_basic_queue_is_ordered_by_discretised_attained_service() -> None:
    # Queues split at 1, 10 and 100 device-hours; arrival order within a queue.
    v = view(1, 1, run("r", 1, P, [(0, 0)]),
             *(JobView(j, 1, B, sub, JobState.PREEMPTED, attained_device_s=att)
               for j, sub, att in [("x", 1.0, 400_000.0), ("y", 2.0, 40_000.0), ("z", 3.0, 4_000.0),
                                   ("w", 4.0, 0.0), ("v", 5.0, 50_000.0)]))
    pol = Singularity(SingularityConfig(short_lane_device_s=0.0))
    pol.decide(v, [], NOW)
    assert [r.id for r in pol.queue.iter_tier(0, {})] == ["w", "z", "y", "v", "x"]


def test_a_rebuilt_state_equals_one_built_job_by_job() -> None:
    # The rebuild allocates every running job in one pass: the same indexes, in the same order, as
    # allocating them one at a time (time-sliced devices included).
    import random

    from tidal.policy.state import SchedState

    rng = random.Random(3)
    for _ in range(40):
        topo = Topology.uniform(rng.randint(1, 5), rng.choice([1, 2, 4, 8]))
        nodes = list(topo.nodes())
        jobs: dict[str, JobView] = {}
        for i in range(rng.randint(0, 20)):
            n = rng.choice(nodes)
            w = rng.randint(1, n.devices)
            devs = tuple(DeviceRef(n.name, x) for x in rng.sample(range(n.devices), w))
            jobs[f"j{i}"] = JobView(f"j{i}", w, rng.choice(list(Tier)), rng.random(), JobState.RUNNING,
                                    placement=rank_map(devs, w), started_at=rng.random(), project=rng.choice("pq"))
        bulk = SchedState(ClusterView(topo, jobs))
        one = SchedState(ClusterView(topo, {}))
        for jv in sorted(jobs.values(), key=lambda j: (j.submitted_at, j.id)):
            rec = one._new_rec(jv)
            one.allocate(rec, list(jv.devices), now=rec.started_at)
            rec.shared = any(one.load[d.node][d.index] > 1 for d in rec.devices)

        def dump(st: SchedState) -> tuple[object, ...]:
            return (
                {n: list(v) for n, v in st.load.items()}, {n: list(v) for n, v in st.free_idx.items()},
                {c: [list(b) for b in bs] for c, bs in st.buckets.items()}, list(st.cluster_free.items()),
                {n: list(v) for n, v in st.node_jobs.items()}, st.node_tier, st.tier_devices,
                [{c: [list(b) for b in bs] for c, bs in r.items()} for r in st.room], st._room_of,
                [(r.id, r.seq, r.running, r.shared, r.devices) for r in st.jobs.values()],
                list(st.running), list(st.usage.items()), st.free_total,
            )

        assert dump(bulk) == dump(one)


# ---- ordering among equals (policy/equals.py) ----------------------------------------------------------------


def test_equal_preemption_rule_levels_and_cost() -> None:
    from tidal.policy.equals import las_level, may_preempt_equal

    kw = {"threshold": 3600.0, "pause_s": 10.0, "cost_ratio": 30.0, "min_run_s": 300.0}
    assert las_level(3599.0, 3600.0) == 0 and las_level(3600.0, 3600.0) == 1
    assert may_preempt_equal(0.0, 5000.0, 300.0, **kw)  # ran 300 s ≥ max(300, 30 × 10)
    assert not may_preempt_equal(0.0, 5000.0, 299.0, **kw)  # not yet worth its pause
    assert not may_preempt_equal(0.0, 5000.0, 10_000.0, **{**kw, "pause_s": 400.0})  # 12,000 s needed
    assert not may_preempt_equal(100.0, 3000.0, 10_000.0, **kw)  # same level: arrival order decides
    assert not may_preempt_equal(4000.0, 50_000.0, 10_000.0, **kw)  # the waiting job is no longer short


def test_a_short_job_preempts_a_long_one_of_its_tier_only_when_enabled() -> None:
    cfg = SingularityConfig(equal_preempt_tiers=(0, 1, 2))
    # s1 has run 10,000 s on the only device (10,000 device-s ≥ 3,600); s2 has had none.
    v = view(1, 1, run("s1", 1, S, [(0, 0)]), pend("s2", 1, S))
    assert summary(Singularity(cfg).decide(v, [], NOW)) == [("preempt", "s1", []), ("place", "s2", [("c0-n0", 0)])]
    assert summary(Singularity().decide(v, [], NOW)) == []
    # Not across tiers downwards: a basic job never preempts a standard one, however long it ran.
    v = view(1, 1, run("s1", 1, S, [(0, 0)]), pend("b", 1, B))
    assert summary(Singularity(cfg).decide(v, [], NOW)) == []
    # Nor a job that changed too recently for its pause to pay off (started 100 s ago).
    v = view(1, 1, run("s1", 1, S, [(0, 0)], started=NOW - 100, attained=9000.0), pend("s2", 1, S))
    assert summary(Singularity(cfg).decide(v, [], NOW)) == []


# ---- shrunk starts of guaranteed work (policy/shrunk_start.py) -------------------------------------------------


def test_wait_for_devices_accumulates_the_soonest_releases() -> None:
    from tidal.policy.shrunk_start import wait_for_devices_s

    assert wait_for_devices_s(4, 4, []) == 0.0
    assert wait_for_devices_s(4, 1, [(500.0, 2), (100.0, 1), (900.0, 8)]) == 500.0  # 1 + 1 @100 + 2 @500
    assert wait_for_devices_s(4, 1, [(100.0, 1)]) == float("inf")


def test_shrunk_start_only_when_it_ends_before_waiting() -> None:
    from tidal.policy.shrunk_start import shrunk_finishes_earlier

    # W = 4 on 2 devices: 2 ranks a device at 0.9 → 1000 s of work takes 2222 s (+10 s to grow).
    assert shrunk_finishes_earlier(4, 2, 1000.0, 1300.0, pause_s=10.0, efficiency=0.9)  # vs 2300
    assert not shrunk_finishes_earlier(4, 2, 1000.0, 1200.0, pause_s=10.0, efficiency=0.9)  # vs 2200


def test_a_standard_job_starts_shrunk_when_waiting_would_end_later() -> None:
    cfg = SingularityConfig(shrunk_start_tiers=(1, 2), preempt=False, equal_preempt_tiers=())

    def jobs(remaining: float) -> ClusterView:
        r = JobView("r", 2, S, 0.0, JobState.RUNNING, placement=rank_map(
            (DeviceRef("c0-n0", 0), DeviceRef("c0-n0", 1)), 2), started_at=NOW, duration_hint=remaining,
            remaining_hint=remaining)
        s = JobView("s", 4, S, 1.0, min_devices=1, max_devices=4, duration_hint=1000.0, remaining_hint=1000.0)
        return view(1, 4, r, s)

    # 2 of 4 devices free; r ends in 5,000 s: 1000 s of work on 2 devices ends in ≈ 2,126 s, first.
    assert summary(Singularity(cfg).decide(jobs(5000.0), [], NOW)) == [("place", "s", [("c0-n0", 2), ("c0-n0", 3)])]
    # r ends in 100 s: waiting (100 + 1000 s) is sooner, so s waits for its 4 devices.
    assert summary(Singularity(cfg).decide(jobs(100.0), [], NOW)) == []
    # Without the rule a standard job never starts shrunk.
    assert summary(Singularity(SingularityConfig(preempt=False)).decide(jobs(5000.0), [], NOW)) == []


# ---- backfill (policy/reservation.py) ----------------------------------------------------------------------


def test_may_borrow_only_lower_tiers_while_the_gang_is_not_due() -> None:
    from tidal.policy.reservation import may_borrow

    assert may_borrow(0, 1, 3600.0, 300.0)
    assert not may_borrow(1, 1, 3600.0, 300.0)  # its own tier: the gang could not take the devices back
    assert not may_borrow(0, 1, 200.0, 300.0)  # the gang is due too soon: not worth a start and a checkpoint
    assert may_borrow(1, 2, float("inf"), 300.0)


def test_a_reserving_gang_lends_its_idle_devices_then_reclaims_them() -> None:
    cfg = SingularityConfig(backfill=True, equal_preempt_tiers=())

    def premium(remaining: float) -> JobView:
        return JobView("p", 1, P, 0.0, JobState.RUNNING, placement=(DeviceRef("c0-n0", 0),), started_at=NOW,
                       duration_hint=remaining, remaining_hint=remaining)

    # A standard gang of 4 cannot preempt premium p: it reserves the node; basic b borrows an idle device
    # since p holds the node for another 5,000 s.
    gang, b = pend("g", 4, S), pend("b", 1, B, submitted=2.0)
    pol = Singularity(cfg)
    assert summary(pol.decide(view(1, 4, premium(5000.0), gang, b), [], NOW)) == [("place", "b", [("c0-n0", 1)])]
    assert summary(Singularity(SingularityConfig(equal_preempt_tiers=())).decide(
        view(1, 4, premium(5000.0), gang, b), [], NOW)) == []  # without backfill the devices stay idle
    # p ends in 100 s: too soon to lend.
    assert summary(Singularity(cfg).decide(view(1, 4, premium(100.0), gang, b), [], NOW)) == []
    # p finished: the gang is due and takes its devices back from the borrower by checkpoint.
    acts = pol.decide(view(1, 4, premium(5000.0), gang, b), [Event("e1", NOW + 10, EventKind.JOB_FINISHED,
                                                                    job_id="p")], NOW + 10)
    assert summary(acts) == [("preempt", "b", []), ("place", "g", [("c0-n0", i) for i in range(4)])]
