"""Spilling (policy/spill.py): a basic job that a premium job needs the devices of moves whole to an idle
cluster instead of being preempted, when it may run there and its image moves there quickly enough."""

from __future__ import annotations

import dataclasses

import pytest

from tidal.core import (
    ActionKind,
    Cluster,
    ClusterView,
    DeviceRef,
    JobState,
    JobView,
    Links,
    Node,
    Region,
    Tier,
    Topology,
    rank_map,
)
from tidal.errors import ValidationError
from tidal.policy import Singularity, SingularityConfig
from tidal.sim.cost import CostModel

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC
NOW = 10_000.0

# Cluster west-a (node w0) in region west; east-a (e0) in region east; and a second cluster of west,
# west-b (w1), for the tests that need one.
WEST_A, EAST_A, WEST_B = ("west", "west-a", "w0"), ("east", "east-a", "e0"), ("west", "west-b", "w1")


def topology(*clusters: tuple[str, str, str], devices: int = 2) -> Topology:
    tree: dict[str, list[Cluster]] = {}
    for region, cluster, node in clusters:
        tree.setdefault(region, []).append(Cluster(cluster, (Node(node, devices),)))
    return Topology(tuple(Region(r, tuple(cs)) for r, cs in tree.items()))


def run(jid: str, w: int, tier: Tier, node: str, *, home: str | None = None, region: str | None = None,
        image_gb: float | None = None) -> JobView:
    d = tuple(DeviceRef(node, i) for i in range(w))
    return JobView(jid, w, tier, 0.0, JobState.RUNNING, placement=rank_map(d, w), started_at=0.0,
                   home_cluster=home, home_region=region, image_gb=image_gb)


def premium(jid: str = "p", w: int = 2, home: str = "west-a") -> JobView:
    return JobView(jid, w, P, 1.0, home_cluster=home)


def decide(topo: Topology, *jobs: JobView, links: Links | None = None,
           cfg: SingularityConfig | None = None) -> list[tuple[str, str, list[tuple[str, int]]]]:
    v = ClusterView(topo, {j.id: j for j in jobs}, links=links or Links())
    acts = Singularity(cfg).decide(v, [], NOW)
    return [(a.kind.value, a.job_id, [(d.node, d.index) for d in a.devices]) for a in acts]


def test_a_basic_job_moves_to_an_idle_cluster_rather_than_being_preempted() -> None:
    topo = topology(WEST_A, EAST_A)
    v = ClusterView(topo, {"b": run("b", 2, B, "w0"), "p": premium()})
    acts = Singularity().decide(v, [], NOW)
    assert [(a.kind, a.job_id, [(d.node, d.index) for d in a.devices]) for a in acts] == [
        (ActionKind.MIGRATE, "b", [("e0", 0), ("e0", 1)]),
        (ActionKind.PLACE, "p", [("w0", 0), ("w0", 1)]),
    ]
    assert "make room for p" in acts[0].reason and "east-a" in acts[0].reason
    assert all(a.live_executable for a in acts)


def test_preempted_when_the_other_cluster_has_no_room() -> None:
    topo = topology(WEST_A, EAST_A)
    # east-a has one idle device: b (2 devices) does not fit whole there; it is not split nor shrunk.
    assert decide(topo, run("b", 2, B, "w0"), run("s", 1, S, "e0"), premium()) == [
        ("preempt", "b", []),
        ("place", "p", [("w0", 0), ("w0", 1)]),
    ]


def test_preempted_when_the_move_would_preempt_in_turn() -> None:
    """Room that another basic job holds is not idle: a spill never preempts."""
    topo = topology(WEST_A, EAST_A, devices=1)
    assert decide(topo, run("b", 1, B, "w0"), run("b2", 1, B, "e0"), premium(w=1)) == [
        ("preempt", "b", []),
        ("place", "p", [("w0", 0)]),
    ]


def test_preempted_when_pinned_to_its_cluster() -> None:
    topo = topology(WEST_A, EAST_A)
    assert decide(topo, run("b", 2, B, "w0", home="west-a"), premium()) == [
        ("preempt", "b", []),
        ("place", "p", [("w0", 0), ("w0", 1)]),
    ]


def test_pinned_to_its_region_it_moves_only_within_it() -> None:
    east_only = topology(WEST_A, EAST_A)
    assert decide(east_only, run("b", 2, B, "w0", region="west"), premium()) == [
        ("preempt", "b", []),
        ("place", "p", [("w0", 0), ("w0", 1)]),
    ]
    both = topology(WEST_A, WEST_B, EAST_A)
    assert decide(both, run("b", 2, B, "w0", region="west"), premium()) == [
        ("migrate", "b", [("w1", 0), ("w1", 1)]),
        ("place", "p", [("w0", 0), ("w0", 1)]),
    ]


def test_preempted_when_the_move_would_take_longer_than_the_bound() -> None:
    topo = topology(WEST_A, EAST_A)
    # 2 ranks of 6.2 GB (the default rank image) over 0.5 GB/s between regions: 24.8 s.
    slow, fast = Links(region_gbps=12.4 / 600.0 * 0.99), Links(region_gbps=12.4 / 600.0 * 1.01)  # just over, under
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=slow)[0] == ("preempt", "b", [])
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=fast)[0][0] == "migrate"
    # The job's own image where the view gives it: 400 GB over 0.5 GB/s is 800 s.
    assert decide(topo, run("b", 2, B, "w0", image_gb=400.0), premium())[0] == ("preempt", "b", [])
    assert decide(topo, run("b", 2, B, "w0", image_gb=300.0), premium())[0][0] == "migrate"
    tight = SingularityConfig(spill_max_pause_s=20.0)
    assert decide(topo, run("b", 2, B, "w0"), premium(), cfg=tight)[0] == ("preempt", "b", [])


def test_within_a_region_the_image_moves_over_the_nodes_links() -> None:
    """Another cluster of the same region: no inter-region link to cross, so a slow one does not matter."""
    topo = topology(WEST_A, WEST_B)
    slow = Links(region_gbps=0.001)
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=slow)[0] == ("migrate", "b", [("w1", 0), ("w1", 1)])
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=Links(node_gbps=0.01))[0] == ("preempt", "b", [])


def test_across_regions_the_pairs_own_rate_counts_where_the_links_have_one() -> None:
    """Live, the rate measured from the job's region to the other: it overrides the one rate between regions,
    for that direction only."""
    topo = topology(WEST_A, EAST_A)
    measured_fast = Links(region_gbps=0.001, pair_gbps={("west", "east"): 1.0})
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=measured_fast)[0][0] == "migrate"
    measured_slow = Links(pair_gbps={("west", "east"): 12.4 / 600.0 * 0.99})  # the default 0.5 would allow it
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=measured_slow)[0] == ("preempt", "b", [])
    the_other_way = Links(region_gbps=0.001, pair_gbps={("east", "west"): 1.0})
    assert decide(topo, run("b", 2, B, "w0"), premium(), links=the_other_way)[0] == ("preempt", "b", [])
    assert measured_fast.between("west", "east") == 1.0
    assert measured_fast.between("east", "west") == 0.001
    assert measured_fast.transfer_s(12.0, 2, cross_region=True, regions=("west", "east")) == pytest.approx(12.0)
    assert measured_fast.transfer_s(12.0, 2, cross_region=True) == pytest.approx(12_000.0)
    assert measured_fast.transfer_s(12.0, 2, cross_region=False, regions=("west", "west")) == pytest.approx(
        12.0 / (2 * 1.188))
    with pytest.raises(ValidationError, match="the rate from region west to east must be above 0 GB/s"):
        Links(pair_gbps={("west", "east"): 0.0})


def test_spilling_can_be_turned_off() -> None:
    topo = topology(WEST_A, EAST_A)
    off = dataclasses.replace(SingularityConfig(), spill=False)
    assert decide(topo, run("b", 2, B, "w0"), premium(), cfg=off)[0] == ("preempt", "b", [])


def test_the_links_estimate_is_the_cost_models_transfer() -> None:
    cost = CostModel()
    links = Links()
    assert (links.node_gbps, links.region_gbps) == (cost.net_gbps_per_node, cost.cross_region_gbps)
    assert dict(links.pair_gbps) == {}  # the cost model has one rate between every two regions
    assert links.transfer_s(12.0, 2, cross_region=False) == pytest.approx(12.0 / (2 * cost.net_gbps_per_node))
    assert links.transfer_s(12.0, 2, cross_region=True) == pytest.approx(12.0 / cost.cross_region_gbps)
    with pytest.raises(ValidationError):
        Links(region_gbps=0.0)
