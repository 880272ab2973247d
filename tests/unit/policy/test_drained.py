"""Drained nodes (``ClusterView.drained``): every policy places, resumes, moves, grows and time-slices nothing
onto them, and leaves the jobs already there running. Each case is run with the node not drained too, where the
policy does use it: the drain, not the case, keeps it off."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.core import (
    ActionKind,
    Cluster,
    ClusterView,
    DeviceRef,
    JobState,
    JobView,
    Node,
    Region,
    Tier,
    Topology,
    rank_map,
)
from tidal.policy import POLICIES, Singularity, SingularityConfig, make_policy
from tidal.policy.base import Policy
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.reasons import Why
from tidal.policy.registry import LIVE_SINGULARITY, SIM_SINGULARITY

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC
NOW = 10_000.0
_STARTS = (ActionKind.PLACE, ActionKind.RESUME, ActionKind.TIME_SLICE, ActionKind.MIGRATE, ActionKind.RESIZE)


def topo(*devices: int, cluster: str = "c") -> Topology:
    return Topology((Region("r", (Cluster(cluster, tuple(Node(f"n{i + 1}", d) for i, d in enumerate(devices))),)),))


def running(jid: str, node: str, devices: int, *, ranks: int | None = None, tier: Tier = B, lo: int | None = None,
            started: float = 0.0, first: int = 0) -> JobView:
    w = ranks or devices
    devs = tuple(DeviceRef(node, i) for i in range(first, first + devices))
    return JobView(jid, w, tier, 0.0, JobState.RUNNING, placement=rank_map(devs, w), started_at=started,
                   min_devices=lo or w, max_devices=w)


def waiting(jid: str, ranks: int = 1, tier: Tier = B, *, state: JobState = JobState.PENDING,
            t: float = 1.0) -> JobView:
    return JobView(jid, ranks, tier, t, state)


def view(t: Topology, *jobs: JobView, drained: frozenset[str] = frozenset()) -> ClusterView:
    return ClusterView(t, {j.id: j for j in jobs}, drained=drained)


POLICY_MAKERS: dict[str, Callable[[], Policy]] = {
    "firstfit": FirstFitPolicy,
    "singularity-live": lambda: Singularity(LIVE_SINGULARITY),
    "singularity-sim": lambda: Singularity(SIM_SINGULARITY),
}


def acts(make: str, v: ClusterView) -> list[tuple[ActionKind, str, list[tuple[str, int]]]]:
    out = POLICY_MAKERS[make]().decide(v, [], NOW)
    return [(a.kind, a.job_id, [(d.node, d.index) for d in a.devices]) for a in out]


def test_a_new_job_is_not_placed_on_a_drained_node() -> None:
    # n1 is idle, n2 is busy (just started: not to be preempted): undrained, the job goes to n1; drained, it waits.
    jobs = (running("r", "n2", 1, started=NOW), waiting("w"))
    for make in POLICY_MAKERS:
        assert acts(make, view(topo(1, 1), *jobs)) == [(ActionKind.PLACE, "w", [("n1", 0)])], make
        assert acts(make, view(topo(1, 1), *jobs, drained=frozenset({"n1"}))) == [], make


def test_a_preempted_job_is_not_resumed_on_a_drained_node_but_elsewhere() -> None:
    job = waiting("w", state=JobState.PREEMPTED)
    for make in POLICY_MAKERS:
        # n1 is the best fit (the fullest that fits) while it takes jobs.
        assert acts(make, view(topo(2, 4), running("r", "n1", 1), job)) == [(ActionKind.RESUME, "w", [("n1", 1)])]
        assert acts(make, view(topo(2, 4), running("r", "n1", 1), job, drained=frozenset({"n1"}))) == [
            (ActionKind.RESUME, "w", [("n2", 0)])], make
        assert acts(make, view(topo(2), running("r", "n1", 1), job, drained=frozenset({"n1"}))) == [], make


def test_jobs_on_a_drained_node_are_left_running() -> None:
    """Nothing is preempted, moved or resized off a drained node for being drained; and no premium job
    preempts them to take their node, which would take nothing new."""
    jobs = (running("r1", "n1", 1), running("r2", "n1", 1, tier=S, first=1))
    for make in POLICY_MAKERS:
        assert acts(make, view(topo(2), *jobs, drained=frozenset({"n1"}))) == [], make
        # A premium job that could only run on n1 by preempting r1: undrained it does, drained it waits.
        prem = waiting("p", tier=P, t=5.0)
        assert acts(make, view(topo(2), *jobs, prem))[0][:2] == (ActionKind.PREEMPT, "r1"), make
        assert acts(make, view(topo(2), *jobs, prem, drained=frozenset({"n1"}))) == [], make


def test_a_drained_node_is_no_spill_target() -> None:
    """A basic job a premium job needs the devices of moves to an idle cluster rather than being preempted
    (spilling), but not to an idle cluster whose node is drained."""
    t = Topology((Region("west", (Cluster("west-a", (Node("w0", 2),)), Cluster("west-b", (Node("w1", 2),)))),))
    b = running("b", "w0", 2)
    p = JobView("p", 2, P, 1.0, home_cluster="west-a")
    assert acts("singularity-live", view(t, b, p))[0] == (ActionKind.MIGRATE, "b", [("w1", 0), ("w1", 1)])
    assert acts("singularity-live", view(t, b, p, drained=frozenset({"w1"}))) == [
        (ActionKind.PREEMPT, "b", []), (ActionKind.PLACE, "p", [("w0", 0), ("w0", 1)])]


def test_a_shrunk_job_does_not_grow_onto_a_drained_node() -> None:
    """An elastic job running shrunk grows into idle devices: in place on its own node while that node takes
    jobs, not there once it is drained (nor onto another drained node); it keeps running as it is."""
    shrunk = running("e", "n1", 2, ranks=4, lo=1)
    for make in ("singularity-live", "singularity-sim"):
        assert acts(make, view(topo(4, 4), shrunk)) == [
            (ActionKind.RESIZE, "e", [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)])], make
        assert acts(make, view(topo(4, 4), shrunk, drained=frozenset({"n1", "n2"}))) == [], make
        # Its own node drained, another free: it may grow by moving there (nothing new lands on n1).
        assert acts(make, view(topo(4, 4), shrunk, drained=frozenset({"n1"}))) == [
            (ActionKind.RESIZE, "e", [("n2", 0), ("n2", 1), ("n2", 2), ("n2", 3)])], make


def test_a_drained_node_is_no_time_slice_host() -> None:
    cfg = SingularityConfig(time_slice=True, preempt=False, defrag=False, grow=False, short_lane_device_s=0)
    host = running("h", "n1", 1)
    guest = waiting("g")
    assert [a.kind for a in Singularity(cfg).decide(view(topo(1), host, guest), [], NOW)] == [ActionKind.TIME_SLICE]
    assert Singularity(cfg).decide(view(topo(1), host, guest, drained=frozenset({"n1"})), [], NOW) == []


def test_a_node_drained_and_undrained_between_decisions_of_one_policy() -> None:
    """A policy that keeps its indexes between decisions (same generation) follows the view's drains."""
    pol = Singularity(LIVE_SINGULARITY)
    t = topo(1)
    w = waiting("w")
    assert pol.decide(view(t, w, drained=frozenset({"n1"})), [], NOW) == []
    out = pol.decide(view(t, w), [], NOW + 1)
    assert [(a.kind, a.job_id) for a in out] == [(ActionKind.PLACE, "w")]
    pol2 = Singularity(LIVE_SINGULARITY)
    assert pol2.decide(view(t, running("r", "n1", 1)), [], NOW) == []
    assert pol2.decide(view(t, running("r", "n1", 1), w, drained=frozenset({"n1"})), [], NOW) == []


def test_the_reason_a_job_waits_names_the_drained_nodes() -> None:
    for make in POLICY_MAKERS:
        pol = POLICY_MAKERS[make]()
        pol.decide(view(topo(1, 1), running("r", "n2", 1, started=NOW), waiting("w"), drained=frozenset({"n1"})), [],
                   NOW)
        r = pol.reasons()["w"]
        assert (r.why, r.text) == (Why.NO_DEVICES, "needs 1 free device(s), 0 free (1 more idle on drained nodes, "
                                                   "which take no new jobs)"), make
        pol.decide(view(topo(1, 1), waiting("w"), drained=frozenset({"n1", "n2"})), [], NOW)
        r = pol.reasons()["w"]
        assert (r.why, r.text) == (Why.NO_NODES, "every node that is up is drained: none takes new jobs (`tidal "
                                                 "nodes` says why)"), make


@st.composite
def worlds(draw: st.DrawFn) -> tuple[ClusterView, float]:
    nodes = draw(st.integers(2, 4))
    per = draw(st.sampled_from([1, 2, 4]))
    t = Topology.uniform(nodes, per)
    free = [DeviceRef(f"c0-n{n}", i) for n in range(nodes) for i in range(per)]
    draw(st.randoms(use_true_random=False)).shuffle(free)
    jobs: dict[str, JobView] = {}
    for k in range(draw(st.integers(0, 6))):
        w = draw(st.integers(1, 6))
        lo = draw(st.integers(1, w))
        d = draw(st.integers(lo, w))
        if d > len(free):
            continue
        devs = tuple(free[:d])
        del free[:d]
        jobs[f"r{k}"] = JobView(f"r{k}", w, draw(st.sampled_from([B, S, P])), 0.0, JobState.RUNNING,
                                min_devices=lo, max_devices=w, placement=rank_map(devs, w),
                                started_at=draw(st.sampled_from([0.0, NOW - 10])), duration_hint=1000.0,
                                remaining_hint=draw(st.floats(1, 1000)))
    for k in range(draw(st.integers(0, 6))):
        w = draw(st.integers(1, 6))
        jobs[f"p{k}"] = JobView(f"p{k}", w, draw(st.sampled_from([B, S, P])), float(k),
                                draw(st.sampled_from([JobState.PENDING, JobState.PREEMPTED])),
                                min_devices=draw(st.integers(1, w)), max_devices=w, duration_hint=1000.0)
    drained = draw(st.sets(st.sampled_from([f"c0-n{n}" for n in range(nodes)]), min_size=1))
    return ClusterView(t, jobs, drained=frozenset(drained)), NOW


@settings(max_examples=200, deadline=None)
@given(worlds(), st.sampled_from(sorted(POLICIES)))
def test_no_policy_puts_anything_new_on_a_drained_node(world: tuple[ClusterView, float], name: str) -> None:
    """Whatever the cluster and policy (the simulator's configurations and baselines too): no start, move,
    resize or time-slice takes a device of a drained node the job did not hold, and no job running only on
    drained nodes is preempted (its devices could serve no one)."""
    v, now = world
    for a in make_policy(name).decide(v, [], now):
        j = v.jobs[a.job_id]
        if a.kind is ActionKind.PREEMPT:
            assert not j.devices or any(d.node not in v.drained for d in j.devices), (name, a)
        elif a.kind in _STARTS:
            new = [d for d in a.devices if d not in j.devices]
            assert not [d for d in new if d.node in v.drained], (name, a, sorted(v.drained))
