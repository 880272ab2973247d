"""Why a job waits, as the pure policies say it after a decision: the exact reason of each job left waiting."""

from __future__ import annotations

from collections.abc import Mapping

from tidal.core import ClusterView, DeviceRef, JobState, JobView, Tier, Topology
from tidal.core import Node as TNode
from tidal.core.topology import Cluster, Region
from tidal.policy.base import Policy
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.reasons import Reason, Why
from tidal.policy.registry import LIVE_SINGULARITY, make_policy
from tidal.policy.singularity import Singularity, SingularityConfig


def topo(*devices: int) -> Topology:
    nodes = tuple(TNode(f"n{i + 1}", d) for i, d in enumerate(devices))
    return Topology((Region("r", (Cluster("c", nodes),)),))


def on(node: str, *idx: int) -> tuple[DeviceRef, ...]:
    return tuple(DeviceRef(node, i) for i in idx)


def job(jid: str, tier: Tier = Tier.BASIC, t: float = 0.0, ranks: int = 1, lo: int = 0, hi: int = 0,
        state: JobState = JobState.PENDING, placement: tuple[DeviceRef, ...] = (), project: str = "default",
        asked: Tier | None = None) -> JobView:
    return JobView(id=jid, ranks=ranks, tier=tier, submitted_at=t, state=state, placement=placement,
                   min_devices=lo or ranks, max_devices=hi, started_at=0.0 if placement else None,
                   project=project, requested_tier=asked)


def running(jid: str, placement: tuple[DeviceRef, ...], tier: Tier = Tier.BASIC, project: str = "default") -> JobView:
    return job(jid, tier, ranks=len(placement), state=JobState.RUNNING, placement=placement, project=project)


def reasons(policy: Policy, t: Topology, *jobs: JobView) -> Mapping[str, Reason]:
    policy.decide(ClusterView(t, {j.id: j for j in jobs}), [], 1000.0)
    return policy.reasons()


def live() -> Policy:
    return Singularity(LIVE_SINGULARITY)


def test_an_elastic_job_needs_half_of_its_devices_free() -> None:
    # W = 8, may run on 1..8: it starts on 4 or more; 3 are free.
    got = reasons(live(), topo(8), running("r", on("n1", 0, 1, 2, 3, 4)), job("e", ranks=8, lo=1))
    assert got == {"e": Reason(Why.NO_DEVICES, "needs 4 free device(s) (an elastic job starts on at least 50% of "
                                                "its 8), 3 free")}
    # Its own minimum when that is higher.
    got = reasons(live(), topo(8), running("r", on("n1", 0, 1, 2, 3, 4)), job("e", ranks=8, lo=6))
    assert got["e"] == Reason(Why.NO_DEVICES, "needs 8 free device(s) (all of them), 3 free")


def test_a_guaranteed_job_starts_whole() -> None:
    got = reasons(live(), topo(4), running("p", on("n1", 0, 1, 2), Tier.PREMIUM), job("s", Tier.STANDARD, ranks=2))
    assert got == {"s": Reason(Why.NO_DEVICES, "needs 2 free device(s) (all of them), 1 free")}


def test_a_job_larger_than_the_cluster() -> None:
    got = reasons(live(), topo(2, 2), job("big", Tier.PREMIUM, ranks=8))
    assert got == {"big": Reason(Why.TOO_LARGE, "needs 8 device(s) (all of them); the cluster has 4")}
    assert reasons(live(), Topology(()), job("a"))["a"] == Reason(Why.NO_NODES, "no node is up")


def test_waiting_behind_higher_tier_jobs() -> None:
    t = topo(2)
    got = reasons(live(), t, running("p", on("n1", 0, 1), Tier.PREMIUM), job("p2", Tier.PREMIUM, t=1, ranks=2),
                  job("s", Tier.STANDARD, t=2), job("b", t=0))
    assert got["p2"] == Reason(Why.NO_DEVICES, "needs 2 free device(s) (all of them), 0 free")
    assert got["s"] == Reason(Why.BEHIND, "waiting behind 1 higher-tier job(s); needs 1 free device(s), 0 free")
    assert got["b"] == Reason(Why.BEHIND, "waiting behind 2 higher-tier job(s); needs 1 free device(s), 0 free")


def test_a_job_admitted_below_the_tier_it_asked_for_says_so() -> None:
    got = reasons(live(), topo(1), running("r", on("n1", 0)), job("a", asked=Tier.PREMIUM))
    assert got["a"] == Reason(Why.ADMISSION, "admitted as basic, not premium (its project's quota was full): "
                                             "needs 1 free device(s), 0 free")


def test_a_project_at_its_quota() -> None:
    pol = Singularity(SingularityConfig(quotas={"vision": 0.5}, min_run_s=0.0))
    got = reasons(pol, topo(4), running("v", on("n1", 0, 1), Tier.STANDARD, project="vision"),
                  running("b", on("n1", 2, 3)), job("v2", Tier.STANDARD, ranks=2, project="vision"))
    assert got == {"v2": Reason(Why.QUOTA, "project 'vision' is at its quota (2 of 2 guaranteed devices in use): "
                                           "it waits for idle devices")}


def test_firstfit_needs_one_node_and_waits_for_the_room_it_makes() -> None:
    got = reasons(FirstFitPolicy(), topo(2, 2), running("a", on("n1", 0)), running("b", on("n2", 0)),
                  job("g", ranks=2))
    assert got == {"g": Reason(Why.SCATTERED, "needs 2 device(s) (all of them, on one node) on as few nodes as "
                                              "they fit; 2 free, at most 1 on one node")}
    # A premium job preempts a basic one for room: it waits for the devices to be freed.
    got = reasons(FirstFitPolicy(), topo(1), running("b", on("n1", 0)), job("p", Tier.PREMIUM))
    assert got == {"p": Reason(Why.MAKING_ROOM, "waiting for devices being freed for it (preempted jobs are "
                                                "checkpointing)")}


def test_started_jobs_have_no_reason() -> None:
    for pol in (live(), FirstFitPolicy(), make_policy("fifo")):
        assert reasons(pol, topo(2), job("a"), job("b")) == {}


def test_every_policy_explains_every_waiting_job() -> None:
    jobs = (running("r", on("n1", 0, 1)), job("a", ranks=2), job("b", Tier.PREMIUM, ranks=4, t=1))
    for name in ("fifo", "tiresias", "singularity", "sjf", "priority-requeue"):
        got = reasons(make_policy(name), topo(2), *jobs)
        waiting = {j for j, r in got.items()}
        assert waiting <= {"a", "b"} and "a" in waiting, (name, got)
        assert all(r.text for r in got.values())
