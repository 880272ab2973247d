"""A user's cap on the devices they hold (ClusterView.device_caps, policy/device_cap.py): never placed, resumed
or grown past it, an elastic job shrunk to fit, and the wait explained."""

from __future__ import annotations

import pytest

from tidal.core import ActionKind, ClusterView, DeviceRef, JobState, JobView, Tier, Topology, rank_map
from tidal.errors import ValidationError
from tidal.policy import Singularity, SingularityConfig
from tidal.policy.device_cap import capped_size, held_by_owner
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.reasons import Reason, Why
from tidal.policy.registry import make_live_policy

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC
NOW = 10_000.0
NO_LANE = SingularityConfig(short_lane_device_s=0.0)


def run(jid: str, owner: str, devs: list[int], *, w: int | None = None, tier: Tier = B,
        project: str = "default") -> JobView:
    d = tuple(DeviceRef("c0-n0", i) for i in devs)
    ranks = w or len(devs)
    return JobView(jid, ranks, tier, 0.0, JobState.RUNNING, project=project, owner=owner,
                   placement=rank_map(d, ranks), started_at=0.0)


def pend(jid: str, owner: str, submitted: float = 1.0, *, w: int = 1, lo: int = 1, tier: Tier = B,
         state: JobState = JobState.PENDING) -> JobView:
    return JobView(jid, w, tier, submitted, state, owner=owner, min_devices=lo)


def view(per: int, *jobs: JobView, caps: dict[str, int] | None = None) -> ClusterView:
    return ClusterView(Topology.uniform(1, per), {j.id: j for j in jobs}, device_caps=caps or {})


def summary(pol: Singularity | FirstFitPolicy, v: ClusterView) -> list[tuple[str, str, int]]:
    return [(a.kind.value, a.job_id, len(a.devices)) for a in pol.decide(v, [], NOW)]


def test_a_user_at_their_cap_waits_while_others_start() -> None:
    v = view(4, run("r", "alice", [0, 1]), pend("a", "alice", 1.0), pend("b", "bob", 2.0), caps={"alice": 2})
    pol = Singularity(NO_LANE)
    assert summary(pol, v) == [("place", "b", 1)]
    assert pol.reasons()["a"] == Reason(Why.DEVICE_CAP, "user alice holds 2 of at most 2 devices (it needs 1)")
    # No cap: alice's job takes a device too (after bob's: she holds more).
    assert summary(Singularity(NO_LANE), view(4, *v.jobs.values())) == [("place", "b", 1), ("place", "a", 1)]


def test_starts_count_against_the_cap_within_one_decision() -> None:
    v = view(8, *(pend(f"a{i}", "alice", 1.0 + i) for i in range(5)), caps={"alice": 3})
    pol = Singularity(NO_LANE)
    assert summary(pol, v) == [("place", "a0", 1), ("place", "a1", 1), ("place", "a2", 1)]
    assert pol.reasons()["a3"].text == "user alice holds 3 of at most 3 devices (it needs 1)"


def test_an_elastic_job_is_shrunk_to_fit_the_cap() -> None:
    # alice holds 1 of 3: her 4-rank job starts on 2 devices (2 ranks each), not 4 and not 3 (no faster than 2).
    v = view(8, run("r", "alice", [0]), pend("e", "alice", w=4, lo=1), caps={"alice": 3})
    (a,) = Singularity(NO_LANE).decide(v, [], NOW)
    assert a.kind is ActionKind.PLACE and len(a.devices) == 2 and len(a.placement) == 4
    assert a.reason == "on 2 of 4 device(s): its owner's device cap"


def test_a_job_whose_minimum_exceeds_what_is_left_waits() -> None:
    v = view(8, run("r", "alice", [0, 1]), pend("g", "alice", w=4, lo=2), caps={"alice": 3})
    pol = Singularity(NO_LANE)
    assert pol.decide(v, [], NOW) == []
    assert pol.reasons()["g"] == Reason(Why.DEVICE_CAP, "user alice holds 2 of at most 3 devices (it needs 2)")
    v0 = view(8, pend("g", "alice", w=4, lo=4), caps={"alice": 3})
    assert pol.decide(v0, [], NOW) == []
    assert pol.reasons()["g"].text == "needs 4 device(s) at the fewest; user alice may hold at most 3"


def test_a_preempted_job_does_not_resume_past_the_cap() -> None:
    v = view(4, run("r", "alice", [0, 1]), pend("p", "alice", state=JobState.PREEMPTED), caps={"alice": 2})
    assert Singularity(NO_LANE).decide(v, [], NOW) == []


def test_growth_stops_at_the_cap() -> None:
    shrunk = run("e", "alice", [0, 1], w=4)
    assert summary(Singularity(NO_LANE), view(8, shrunk, caps={"alice": 3})) == []  # 3 devices: no faster than 2
    assert summary(Singularity(NO_LANE), view(8, shrunk, caps={"alice": 4})) == [("resize", "e", 4)]
    assert summary(Singularity(NO_LANE), view(8, shrunk, run("o", "alice", [5]), caps={"alice": 4})) == []


def test_a_capped_guaranteed_job_preempts_no_one() -> None:
    v = view(2, run("s", "alice", [0], tier=S), run("b", "bob", [1]), pend("p", "alice", tier=P),
             caps={"alice": 1})
    assert Singularity(NO_LANE).decide(v, [], NOW) == []
    assert [a.kind for a in Singularity(NO_LANE).decide(view(2, *v.jobs.values()), [], NOW)] == [
        ActionKind.PREEMPT, ActionKind.PLACE]


def test_the_cap_counts_every_project_and_tier() -> None:
    v = view(4, run("q", "alice", [0], tier=P, project="q"), run("p", "alice", [1], project="p"),
             pend("a", "alice"), caps={"alice": 2})
    assert held_by_owner(v) == {"alice": 2}
    assert Singularity(NO_LANE).decide(v, [], NOW) == []


def test_the_live_policy_and_first_fit_keep_the_cap() -> None:
    v = view(4, run("r", "alice", [0]), pend("a", "alice", w=2, lo=2), pend("b", "bob", 2.0), caps={"alice": 2})
    assert summary(make_live_policy(), v) == [("place", "b", 1)]  # type: ignore[arg-type]
    ff = FirstFitPolicy()
    assert summary(ff, v) == [("place", "b", 1)]
    assert ff.reasons()["a"].text == "user alice holds 1 of at most 2 devices (it needs 2)"


def test_capped_size() -> None:
    assert capped_size(8, 1, 8, None) == 8
    assert capped_size(8, 1, 8, 8) == 8
    assert capped_size(8, 1, 8, 6) == 4
    assert capped_size(8, 3, 8, 2) == 0
    assert capped_size(8, 1, 8, 0) == 0


def test_caps_must_be_whole_devices() -> None:
    with pytest.raises(ValidationError) as e:
        view(1, caps={"alice": -1})
    assert e.value.message == "device cap of user 'alice' must be a whole number of devices, 0 or more, not -1"
    with pytest.raises(ValidationError):
        view(1, caps={"alice": 1.5})  # type: ignore[dict-item]
    assert view(1).device_caps == {}
