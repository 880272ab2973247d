"""The first-fit policy: tier then submission order, best fit on one node, preemption of basic jobs for
premium/standard ones (never more than needed), devices being freed set aside."""

from __future__ import annotations

import dataclasses

from tidal.core import ActionKind, ClusterView, DeviceRef, JobState, JobView, Tier, Topology
from tidal.core import Node as TNode
from tidal.core.topology import Cluster, Region
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.global_level import candidate_clusters
from tidal.policy.state import SchedState


def topo(*devices: int) -> Topology:
    nodes = tuple(TNode(f"n{i + 1}", d) for i, d in enumerate(devices))
    return Topology((Region("r", (Cluster("c", nodes),)),))


def job(jid: str, tier: Tier = Tier.BASIC, t: float = 0.0, ranks: int = 1,
        state: JobState = JobState.PENDING, on: tuple[DeviceRef, ...] = (), started: float | None = None) -> JobView:
    return JobView(id=jid, ranks=ranks, tier=tier, submitted_at=t, state=state, placement=on, started_at=started)


def decide(t: Topology, *jobs: JobView) -> list:  # type: ignore[type-arg]
    return FirstFitPolicy().decide(ClusterView(t, {j.id: j for j in jobs}), [], 0.0)


def test_places_by_tier_then_submission_time() -> None:
    out = decide(topo(1, 1), job("b1", t=0), job("p1", Tier.PREMIUM, t=5), job("s1", Tier.STANDARD, t=1))
    assert [(a.job_id, a.kind) for a in out] == [("p1", ActionKind.PLACE), ("s1", ActionKind.PLACE)]


def test_gang_on_one_node_best_fit() -> None:
    out = decide(topo(4, 2), job("a", ranks=2))
    assert out[0].placement == (DeviceRef("n2", 0), DeviceRef("n2", 1))
    out = decide(topo(4, 2), job("a", ranks=3))
    assert {d.node for d in out[0].placement} == {"n1"}


def test_preempted_jobs_resume() -> None:
    out = decide(topo(1), job("a", state=JobState.PREEMPTED))
    assert out[0].kind is ActionKind.RESUME


def test_premium_preempts_the_newest_basic_only_as_needed() -> None:
    on1, on2 = (DeviceRef("n1", 0),), (DeviceRef("n1", 1),)
    running = [job("old", state=JobState.RUNNING, on=on1, started=1.0),
               job("new", state=JobState.RUNNING, on=on2, started=2.0)]
    out = decide(topo(2), *running, job("p", Tier.PREMIUM, t=3))
    assert [(a.job_id, a.kind) for a in out] == [("new", ActionKind.PREEMPT)]
    assert not out[0].kill


def test_basic_never_preempts_and_standard_never_preempts_standard() -> None:
    on = (DeviceRef("n1", 0),)
    assert decide(topo(1), job("r", state=JobState.RUNNING, on=on), job("b", t=1)) == []
    assert decide(topo(1), job("r", Tier.STANDARD, state=JobState.RUNNING, on=on),
                  job("s", Tier.STANDARD, t=1)) == []


def test_devices_being_freed_are_set_aside() -> None:
    # the basic job is already being checkpointed for the premium one: no second preemption, and the
    # waiting basic job does not take the device that is about to be free
    on = (DeviceRef("n1", 0),)
    out = decide(topo(1, 1), job("v", state=JobState.CHECKPOINTING, on=on),
                 job("x", state=JobState.RUNNING, on=(DeviceRef("n2", 0),)),
                 job("p", Tier.PREMIUM, t=5), job("b", t=6))
    assert out == []


def test_reserved_target_devices_are_not_free() -> None:
    tgt = (DeviceRef("n2", 0),)
    out = decide(topo(1, 1), job("m", state=JobState.RUNNING, on=(DeviceRef("n1", 0),)),
                 job("m@target", Tier.PREMIUM, state=JobState.MIGRATING, on=tgt), job("b", t=1))
    assert out == []


def two_regions() -> Topology:
    return Topology((Region("west", (Cluster("w-a", (TNode("w1", 2),)), Cluster("w-b", (TNode("w2", 4),)))),
                     Region("east", (Cluster("e-a", (TNode("e1", 1),)),))))


def test_pins_to_a_cluster_or_region_are_kept() -> None:
    east = dataclasses.replace(job("east"), home_region="east")
    wb = dataclasses.replace(job("wb"), home_cluster="w-b")
    out = decide(two_regions(), east, wb)
    assert {a.job_id: {d.node for d in a.placement} for a in out} == {"east": {"e1"}, "wb": {"w2"}}
    # Pinned where there is no room: not placed, whatever is free elsewhere.
    big = dataclasses.replace(job("big", ranks=2), home_region="east")
    premium = dataclasses.replace(job("p", Tier.PREMIUM, ranks=2), home_region="east")
    assert decide(two_regions(), big) == []
    assert decide(two_regions(), premium) == []
    # Tidal's own policy's choice of clusters for a job pinned to a region.
    st = SchedState(ClusterView(two_regions(), {}))
    rec = st.add_pending(dataclasses.replace(job("r"), home_region="west"))
    assert sorted(candidate_clusters(st, rec)) == ["w-a", "w-b"]
