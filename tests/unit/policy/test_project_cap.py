"""A project's cap on the devices its jobs hold (ClusterView.project_caps, policy/device_cap.py): never placed,
resumed or grown past it, an elastic job shrunk to fit, other projects unaffected, and the wait explained; with a
user's cap too, the one that binds."""

from __future__ import annotations

import pytest

from tidal.core import ActionKind, ClusterView, DeviceRef, JobState, JobView, Tier, Topology, rank_map
from tidal.errors import ValidationError
from tidal.policy import Singularity, SingularityConfig
from tidal.policy.device_cap import held_by_project
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.reasons import Reason, Why
from tidal.policy.registry import make_live_policy

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC
NOW = 10_000.0
NO_LANE = SingularityConfig(short_lane_device_s=0.0)


def run(jid: str, project: str, devs: list[int], *, owner: str = "alice", w: int | None = None,
        tier: Tier = B) -> JobView:
    d = tuple(DeviceRef("c0-n0", i) for i in devs)
    ranks = w or len(devs)
    return JobView(jid, ranks, tier, 0.0, JobState.RUNNING, project=project, owner=owner,
                   placement=rank_map(d, ranks), started_at=0.0)


def pend(jid: str, project: str, submitted: float = 1.0, *, owner: str = "alice", w: int = 1, lo: int = 1,
         tier: Tier = B, state: JobState = JobState.PENDING) -> JobView:
    return JobView(jid, w, tier, submitted, state, project=project, owner=owner, min_devices=lo)


def view(per: int, *jobs: JobView, caps: dict[str, int] | None = None,
         users: dict[str, int] | None = None) -> ClusterView:
    return ClusterView(Topology.uniform(1, per), {j.id: j for j in jobs}, device_caps=users or {},
                       project_caps=caps or {})


def summary(pol: Singularity | FirstFitPolicy, v: ClusterView) -> list[tuple[str, str, int]]:
    return [(a.kind.value, a.job_id, len(a.devices)) for a in pol.decide(v, [], NOW)]


def test_a_project_at_its_cap_waits_while_other_projects_start() -> None:
    # alice and bob share vision: bob's job is held by what alice's hold; carol's in nlp starts.
    v = view(8, run("r", "vision", [0, 1]), pend("a", "vision", 1.0, owner="bob"),
             pend("c", "nlp", 2.0, owner="carol"), caps={"vision": 2})
    pol = Singularity(NO_LANE)
    assert summary(pol, v) == [("place", "c", 1)]
    assert pol.reasons()["a"] == Reason(Why.PROJECT_CAP, "project vision holds 2 of at most 2 devices (it needs 1)")
    # No cap: bob's job starts too (after carol's: nlp holds fewer devices).
    assert summary(Singularity(NO_LANE), view(8, *v.jobs.values())) == [("place", "c", 1), ("place", "a", 1)]


def test_starts_within_the_cap_count_against_it_within_one_decision() -> None:
    v = view(8, *(pend(f"v{i}", "vision", 1.0 + i, owner=f"u{i}") for i in range(5)), caps={"vision": 3})
    pol = Singularity(NO_LANE)
    assert summary(pol, v) == [("place", "v0", 1), ("place", "v1", 1), ("place", "v2", 1)]
    assert pol.reasons()["v3"].text == "project vision holds 3 of at most 3 devices (it needs 1)"


def test_an_elastic_job_is_shrunk_to_fit_the_projects_cap() -> None:
    # vision holds 1 of 3 (bob's): alice's 4-rank job starts on 2 devices, not 4 and not 3 (no faster than 2).
    v = view(8, run("r", "vision", [0], owner="bob"), pend("e", "vision", w=4, lo=1), caps={"vision": 3})
    (a,) = Singularity(NO_LANE).decide(v, [], NOW)
    assert a.kind is ActionKind.PLACE and len(a.devices) == 2 and len(a.placement) == 4
    assert a.reason == "on 2 of 4 device(s): its project's device cap"


def test_a_job_whose_minimum_exceeds_what_is_left_waits() -> None:
    v = view(8, run("r", "vision", [0, 1], owner="bob"), pend("g", "vision", w=4, lo=2), caps={"vision": 3})
    pol = Singularity(NO_LANE)
    assert pol.decide(v, [], NOW) == []
    assert pol.reasons()["g"] == Reason(Why.PROJECT_CAP, "project vision holds 2 of at most 3 devices (it needs 2)")
    assert pol.decide(view(8, pend("g", "vision", w=4, lo=4), caps={"vision": 3}), [], NOW) == []
    assert pol.reasons()["g"].text == "needs 4 device(s) at the fewest; project vision may hold at most 3"


def test_a_preempted_job_does_not_resume_past_the_cap() -> None:
    v = view(4, run("r", "vision", [0, 1]), pend("p", "vision", state=JobState.PREEMPTED), caps={"vision": 2})
    assert Singularity(NO_LANE).decide(v, [], NOW) == []
    assert summary(Singularity(NO_LANE), view(4, *v.jobs.values(), caps={"vision": 3})) == [("resume", "p", 1)]


def test_growth_stops_at_the_cap() -> None:
    shrunk = run("e", "vision", [0, 1], w=4)
    assert summary(Singularity(NO_LANE), view(8, shrunk, caps={"vision": 3})) == []  # 3: no faster than 2
    assert summary(Singularity(NO_LANE), view(8, shrunk, caps={"vision": 4})) == [("resize", "e", 4)]
    other = run("o", "vision", [5], owner="bob")
    assert summary(Singularity(NO_LANE), view(8, shrunk, other, caps={"vision": 4})) == []
    assert summary(Singularity(NO_LANE), view(8, shrunk, run("o", "nlp", [5], owner="bob"),
                                              caps={"vision": 4})) == [("resize", "e", 4)]


def test_a_guaranteed_job_held_by_its_projects_cap_preempts_no_one() -> None:
    v = view(2, run("s", "vision", [0], tier=S), run("b", "nlp", [1], owner="bob"), pend("p", "vision", tier=P),
             caps={"vision": 1})
    pol = Singularity(NO_LANE)
    assert pol.decide(v, [], NOW) == []
    assert pol.reasons()["p"].why is Why.PROJECT_CAP
    assert [a.kind for a in Singularity(NO_LANE).decide(view(2, *v.jobs.values()), [], NOW)] == [
        ActionKind.PREEMPT, ActionKind.PLACE]


def test_the_cap_counts_every_user_and_tier_of_the_project() -> None:
    v = view(4, run("q", "vision", [0], tier=P), run("p", "vision", [1], owner="bob"),
             run("n", "nlp", [2], owner="bob"), pend("a", "vision", owner="carol"), caps={"vision": 2})
    assert held_by_project(v) == {"vision": 2, "nlp": 1}
    assert Singularity(NO_LANE).decide(v, [], NOW) == []


def test_owner_and_project_caps_together_the_one_that_binds() -> None:
    # alice may hold 3 and holds 1; vision may hold 2 and holds 2 (bob's too): the project's cap binds.
    jobs = (run("r", "vision", [0]), run("b", "vision", [1], owner="bob"), pend("a", "vision", w=2, lo=1))
    pol = Singularity(NO_LANE)
    assert pol.decide(view(8, *jobs, caps={"vision": 2}, users={"alice": 3}), [], NOW) == []
    assert pol.reasons()["a"].text == "project vision holds 2 of at most 2 devices (it needs 1)"
    # alice may hold 1 (she holds it); vision 4 of which 2 are held: her cap binds.
    assert pol.decide(view(8, *jobs, caps={"vision": 4}, users={"alice": 1}), [], NOW) == []
    assert pol.reasons()["a"] == Reason(Why.DEVICE_CAP, "user alice holds 1 of at most 1 devices (it needs 1)")
    # Room under both: the smaller decides the size (alice 2 left, vision 1 left: 1 device).
    (a,) = Singularity(NO_LANE).decide(view(8, *jobs, caps={"vision": 3}, users={"alice": 3}), [], NOW)
    assert (len(a.devices), a.reason) == (1, "on 1 of 2 device(s): its project's device cap")
    (a,) = Singularity(NO_LANE).decide(view(8, *jobs, caps={"vision": 4}, users={"alice": 2}), [], NOW)
    assert (len(a.devices), a.reason) == (1, "on 1 of 2 device(s): its owner's device cap")


def test_the_live_policy_and_first_fit_keep_the_cap() -> None:
    v = view(4, run("r", "vision", [0]), pend("a", "vision", w=2, lo=2, owner="bob"),
             pend("c", "nlp", 2.0, owner="carol"), caps={"vision": 2})
    assert summary(make_live_policy(), v) == [("place", "c", 1)]  # type: ignore[arg-type]
    ff = FirstFitPolicy()
    assert summary(ff, v) == [("place", "c", 1)]
    assert ff.reasons()["a"] == Reason(Why.PROJECT_CAP, "project vision holds 1 of at most 2 devices (it needs 2)")
    # First fit counts its own starts within a decision: of vision's three 1-device jobs, two start.
    v2 = view(4, *(pend(f"v{i}", "vision", 1.0 + i, owner=f"u{i}") for i in range(3)), caps={"vision": 2})
    assert summary(FirstFitPolicy(), v2) == [("place", "v0", 1), ("place", "v1", 1)]


def test_project_caps_must_be_whole_devices() -> None:
    with pytest.raises(ValidationError) as e:
        view(1, caps={"vision": -1})
    assert e.value.message == "device cap of project 'vision' must be a whole number of devices, 0 or more, not -1"
    assert (e.value.fields, e.value.hint) == ({"field": "project_caps"},
                                             "give each capped project the most devices its jobs may hold, e.g. 8")
    with pytest.raises(ValidationError):
        view(1, caps={"vision": True})
    assert view(1).project_caps == {}
