"""Turns between users within a tier (policy/queue_order.py): projects by their share, within a project the
user holding the fewest devices next, within a user's jobs least attained service then arrival."""

from __future__ import annotations

import dataclasses

from tidal.core import ActionKind, ClusterView, DeviceRef, Event, EventKind, JobState, JobView, Tier, Topology, rank_map
from tidal.policy import Singularity, SingularityConfig
from tidal.policy.queue_order import OwnerQueues, TieredFairQueue
from tidal.policy.registry import LIVE_SINGULARITY, SIM_SINGULARITY
from tidal.policy.state import JobRec

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC
NOW = 10_000.0
NO_LANE = SingularityConfig(short_lane_device_s=0.0)


def run(jid: str, owner: str, devs: list[int], *, tier: Tier = B, project: str = "default", node: int = 0) -> JobView:
    d = tuple(DeviceRef(f"c0-n{node}", i) for i in devs)
    return JobView(jid, len(devs), tier, 0.0, JobState.RUNNING, project=project, owner=owner,
                   placement=rank_map(d, len(d)), started_at=0.0)


def pend(jid: str, owner: str, submitted: float, *, w: int = 1, tier: Tier = B, project: str = "default",
         attained: float = 0.0) -> JobView:
    state = JobState.PREEMPTED if attained else JobState.PENDING
    return JobView(jid, w, tier, submitted, state, project=project, owner=owner, attained_device_s=attained)


def view(per: int, *jobs: JobView) -> ClusterView:
    return ClusterView(Topology.uniform(1, per), {j.id: j for j in jobs})


def placed(pol: Singularity, v: ClusterView, events: list[Event] | None = None, now: float = NOW) -> list[str]:
    return [a.job_id for a in pol.decide(v, events or [], now) if a.kind in (ActionKind.PLACE, ActionKind.RESUME)]


def test_a_thousand_waiting_jobs_of_one_user_do_not_put_another_users_job_behind_them() -> None:
    flood = [pend(f"a{i}", "alice", 1.0 + i) for i in range(1000)]
    v = view(4, run("r0", "alice", [0]), run("r1", "alice", [1]), run("r2", "alice", [2]), *flood,
             pend("bob", "bob", 5000.0))
    assert placed(Singularity(NO_LANE), v) == ["bob"]  # the one free device: bob holds none, alice three
    # Without turns between users the flood goes first, in arrival order.
    assert placed(Singularity(dataclasses.replace(NO_LANE, user_share=False)), v) == ["a0"]


def test_users_alternate_as_their_jobs_start() -> None:
    jobs = [pend(f"a{i}", "alice", 1.0 + i) for i in range(5)] + [pend(f"b{i}", "bob", 100.0 + i) for i in range(5)]
    assert placed(Singularity(NO_LANE), view(4, *jobs)) == ["a0", "b0", "a1", "b1"]


def test_a_tie_in_devices_held_goes_to_the_earlier_job() -> None:
    v = view(3, run("ra", "alice", [0]), run("rb", "bob", [1]), pend("a", "alice", 5.0), pend("b", "bob", 2.0))
    assert placed(Singularity(NO_LANE), v) == ["b"]
    # The same instant: the order the policy numbered them in (submission time, then id).
    v = view(3, run("ra", "alice", [0]), run("rb", "bob", [1]), pend("y", "alice", 5.0), pend("x", "bob", 5.0))
    assert placed(Singularity(NO_LANE), v) == ["x"]


def test_projects_take_turns_before_their_users() -> None:
    # p1 holds 2 devices (carol's), p2 one (alice's): p2 goes first, though bob (p1) holds fewer than alice.
    v = view(4, run("c", "carol", [0, 1], project="p1"), run("r", "alice", [2], project="p2"),
             pend("bob", "bob", 1.0, project="p1"), pend("alice", "alice", 2.0, project="p2"))
    assert placed(Singularity(NO_LANE), v) == ["alice"]


def test_a_users_devices_count_in_every_project_and_tier() -> None:
    # alice holds 2 premium devices in project q; in project p, bob's job (he holds 1) goes before hers.
    v = view(4, run("q", "alice", [0, 1], tier=P, project="q"), run("rb", "bob", [2], project="p"),
             pend("a", "alice", 1.0, project="p"), pend("b", "bob", 2.0, project="p"))
    assert placed(Singularity(NO_LANE), v) == ["b"]


def test_weights_share_devices_between_projects_not_users() -> None:
    # p1 weighs 3: with 2 devices held it is at 2/3 against p2's 1: p1 goes first.
    v = view(4, run("r1", "alice", [0, 1], project="p1"), run("r2", "bob", [2], project="p2"),
             pend("a", "alice", 1.0, project="p1"), pend("b", "bob", 0.5, project="p2"))
    assert placed(Singularity(dataclasses.replace(NO_LANE, project_weights={"p1": 3.0})), v) == ["a"]
    assert placed(Singularity(NO_LANE), v) == ["b"]


def test_a_users_own_jobs_keep_least_attained_service_then_arrival() -> None:
    q = TieredFairQueue(3600.0, las_tiers=(0,), las_levels=4)
    recs = [JobRec(pend(j, "alice", sub, attained=att), seq)
            for seq, (j, sub, att) in enumerate([("x", 1.0, 400_000.0), ("y", 2.0, 4_000.0), ("z", 3.0, 0.0),
                                                 ("w", 4.0, 0.0)])]
    recs.append(JobRec(pend("b", "bob", 9.0), 9))
    q.add_many(recs)
    # alice's in least-attained-service order (queues split at 1, 10 and 100 device-hours), then arrival.
    # Nobody starts anything here, so neither holds more: the tie goes to the earlier head, alice's, each time.
    assert [r.id for r in q.iter_tier(0, {}, {})] == ["z", "w", "y", "x", "b"]
    # With alice holding a device, bob goes first.
    assert [r.id for r in q.iter_tier(0, {}, {"alice": 1})] == ["b", "z", "w", "y", "x"]
    assert len(q) == 5 and recs[0] in q
    assert q.remove(recs[2]) and not q.remove(recs[2]) and len(q) == 4


def test_owner_queues_reread_usage_as_jobs_start() -> None:
    q = OwnerQueues(lambda r: (r.submit,))
    for seq, (j, o) in enumerate([("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob")]):
        q.add(JobRec(pend(j, o, float(seq)), seq))
    usage = {"alice": 0, "bob": 5}
    out = []
    for rec in q.iter(usage):
        out.append(rec.id)
        usage[rec.owner] += 3  # the caller started it on 3 devices
    # alice 0 → a1 (alice 3, bob 5) → a2 (alice 6) → b1 (bob 8) → a3.
    assert out == ["a1", "a2", "b1", "a3"]


def test_the_short_lane_takes_users_in_turn() -> None:
    cfg = SingularityConfig(short_lane_device_s=3600.0, short_lane_share=1.0)
    v = view(3, run("r", "alice", [0]), *(pend(f"a{i}", "alice", 1.0 + i) for i in range(5)),
             pend("bob", "bob", 10.0))
    assert placed(Singularity(cfg), v)[:1] == ["bob"]
    assert placed(Singularity(dataclasses.replace(cfg, user_share=False)), v)[:1] == ["a0"]


def test_new_arrivals_of_several_users_start_in_turn_as_after_a_rebuild() -> None:
    # Two free devices; alice holds one. a1, a2 (alice) and b1 (bob) arrive in one decision: bob first, then
    # the earlier of alice's; a fresh policy, rebuilding from the same view (as the live loop does), agrees.
    base = [run("r", "alice", [0])]
    pol = Singularity(NO_LANE)
    assert pol.decide(view(3, *base), [], NOW) == []
    new = [pend("a1", "alice", NOW), pend("a2", "alice", NOW), pend("b1", "bob", NOW)]
    v = view(3, *base, *new)
    events = [Event(f"e{i}", NOW, EventKind.JOB_SUBMITTED, job_id=j.id) for i, j in enumerate(new)]
    assert placed(pol, v, events) == ["b1", "a1"]
    assert placed(Singularity(NO_LANE), v) == ["b1", "a1"]


def test_a_trace_without_users_runs_as_one_users() -> None:
    # JobView's owner defaults to one user: the project's jobs in least-attained-service then arrival order.
    v = view(2, run("r", "", [0]), pend("a", "", 1.0), pend("b", "", 2.0))
    assert placed(Singularity(NO_LANE), v) == ["a"]


def test_turns_between_users_are_on_live_and_in_the_simulator() -> None:
    assert LIVE_SINGULARITY.user_share and SIM_SINGULARITY.user_share
