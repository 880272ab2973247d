from __future__ import annotations

import pytest

from tidal.core import (
    TRANSITIONS,
    Action,
    ActionKind,
    ClusterView,
    DeviceRef,
    Event,
    EventKind,
    JobSpec,
    JobState,
    JobView,
    Tier,
    Topology,
    advance,
    limits,
    rank_map,
)
from tidal.core.spec import validate_env
from tidal.errors import Conflict, ValidationError


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"name": "j", "command": ["python", "train.py"], "workdir": "/work"}
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_tiers_are_ordered() -> None:
    assert Tier.BASIC < Tier.STANDARD < Tier.PREMIUM
    assert max([Tier.STANDARD, Tier.PREMIUM, Tier.BASIC]) is Tier.PREMIUM
    assert Tier.parse("Premium") is Tier.PREMIUM
    assert Tier.PREMIUM.target == 0.95 and Tier.STANDARD.target == 0.70 and Tier.BASIC.target is None
    with pytest.raises(ValidationError) as e:
        Tier.parse("gold")
    assert e.value.fields["field"] == "tier"


def test_jobspec_defaults_elastic_bounds_to_1_w() -> None:
    s = spec(ranks=4)
    assert (s.min_devices, s.max_devices) == (1, 4)
    assert s.elastic and s.max_restarts == 3 and s.tier is Tier.BASIC
    assert spec(ranks=2, tier="premium").tier is Tier.PREMIUM


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"name": " "}, "name"),
        ({"command": []}, "command"),
        ({"workdir": "rel/path"}, "workdir"),
        ({"ranks": 0}, "ranks"),
        ({"ranks": 2, "min_devices": 0}, "min_devices"),
        ({"ranks": 2, "max_devices": 3}, "max_devices"),
        ({"ranks": 4, "min_devices": 3, "max_devices": 2}, "min_devices"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"env": {"A=B": "x"}}, "env"),
        ({"project": ""}, "project"),
        ({"ranks": 2**70}, "ranks"),
        ({"ranks": limits.MAX_RANKS + 1}, "ranks"),
        ({"name": "a\ud800"}, "name"),
        ({"name": "a\x00"}, "name"),
        ({"name": "n" * (limits.MAX_NAME_CHARS + 1)}, "name"),
        ({"command": ["python", "\udfff"]}, "command"),
        ({"command": ["python", "a\x00"]}, "command"),
        ({"command": ["x" * (limits.MAX_ARG_BYTES + 1)]}, "command"),
        ({"command": ["x"] * (limits.MAX_COMMAND_ARGS + 1)}, "command"),
        ({"workdir": "/w\ud800"}, "workdir"),
        ({"checkpoint_every": float("inf")}, "checkpoint_every"),
        ({"checkpoint_every": float("nan")}, "checkpoint_every"),
        ({"max_restarts": 2**70}, "max_restarts"),
        ({"project": "\ud800"}, "project"),
        ({"project": "p" * (limits.MAX_PROJECT_CHARS + 1)}, "project"),
    ],
)
def test_jobspec_validation_names_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    assert e.value.fields["field"] == field


@pytest.mark.parametrize(
    ("env", "what"),
    [
        ({"TIDAL_TOKEN": "t"}, "TIDAL_TOKEN: variables beginning with TIDAL_ are Tidal's own settings"),
        ({"tidal_home": "/x"}, "tidal_home: variables beginning with TIDAL_"),
        ({"": "x"}, "'' is not a variable name"),
        ({"A=B": "x"}, "A=B is not a variable name"),
        ({"A\x00B": "x"}, "is not a variable name"),
        ({"A": "x\x00"}, "A: the value holds a NUL character"),
        ({"\ud800": "x"}, "the name is not valid Unicode text"),
        ({"A": "\ud800"}, "A: the value is not valid Unicode text"),
        ({"N" * (limits.MAX_ENV_NAME_BYTES + 1): "x"}, "the name is over"),
        ({"A": "v" * (limits.MAX_ENV_VALUE_BYTES + 1)}, "A: the value is"),
        ({f"V{i}": "x" * 60_000 for i in range(5)}, "bytes in all, over"),
        ({f"V{i}": "" for i in range(limits.MAX_ENV_VARS + 1)}, "variables, more than"),
    ],
)
def test_job_env_is_checked(env: dict[str, str], what: str) -> None:
    with pytest.raises(ValidationError) as e:
        spec(env=env)
    assert e.value.fields["field"] == "env"
    assert what in e.value.message, e.value.message


def test_job_env_may_set_the_loaders_variables() -> None:
    # The ranks' command runs as the job's owner: these are as safe as in the owner's own shell.
    env = {"LD_PRELOAD": "/opt/x.so", "LD_LIBRARY_PATH": "/opt/lib", "MY_TIDAL_VAR": "1", "A": "x=y"}
    assert dict(spec(env=env).env) == env
    validate_env({f"V{i}": "" for i in range(limits.MAX_ENV_VARS)})


def test_lifecycle_main_path_and_invalid_transition() -> None:
    s = JobState.PENDING
    for nxt in (JobState.RUNNING, JobState.CHECKPOINTING, JobState.MIGRATING, JobState.RESTORING,
                JobState.RUNNING, JobState.CHECKPOINTING, JobState.PREEMPTED, JobState.RESTORING,
                JobState.RUNNING, JobState.CHECKPOINTING, JobState.RESIZING, JobState.RESTORING,
                JobState.RUNNING, JobState.SUCCEEDED):
        s = advance(s, nxt)
    assert s is JobState.SUCCEEDED
    with pytest.raises(Conflict) as e:
        advance(JobState.PENDING, JobState.PREEMPTED, job="x")
    assert "pending" in e.value.message and e.value.fields["target"] == "preempted"
    with pytest.raises(Conflict):
        advance(JobState.SUCCEEDED, JobState.RUNNING)


def test_lifecycle_hold_and_requeue() -> None:
    assert advance(JobState.PENDING, JobState.HELD) is JobState.HELD
    assert advance(JobState.PREEMPTED, JobState.HELD) is JobState.HELD
    assert advance(JobState.HELD, JobState.PENDING) is JobState.PENDING
    assert advance(JobState.RUNNING, JobState.PENDING) is JobState.PENDING  # kill and requeue
    assert advance(JobState.CHECKPOINTING, JobState.RUNNING) is JobState.RUNNING  # periodic checkpoint
    for s in JobState:
        if s not in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
            assert JobState.CANCELLED in TRANSITIONS[s]


def test_topology_lookups_and_duplicates() -> None:
    t = Topology.uniform(2, 4)
    assert t.devices == 8 and t.cluster_of("c0-n1") == "c0" and t.region_of("c0") == "r0"
    assert t.cluster("c0").devices_per_node == 4
    from tidal.core import Cluster, Node, Region

    with pytest.raises(ValidationError):
        Topology((Region("r", (Cluster("a", (Node("n", 1),)), Cluster("b", (Node("n", 1),)))),))


def test_rank_map_packs_contiguously() -> None:
    d = (DeviceRef("n", 0), DeviceRef("n", 1))
    assert rank_map(d, 4) == (d[0], d[0], d[1], d[1])
    assert rank_map(d, 3) == (d[0], d[0], d[1])


def test_actions_live_executable_flags() -> None:
    live = {k: Action("a", k, "j").live_executable for k in ActionKind}
    assert live == {
        ActionKind.PLACE: True, ActionKind.PREEMPT: True, ActionKind.RESUME: True, ActionKind.MIGRATE: True,
        ActionKind.RESIZE: True, ActionKind.TIME_SLICE: False,
    }
    assert not Action("a", ActionKind.PREEMPT, "j", kill=True).live_executable


def test_event_and_action_records_share_a_log_format() -> None:
    e = Event("e1", 5.0, EventKind.JOB_SUBMITTED, job_id="j", cause=None)
    assert e.to_record() == {"type": "event", "id": "e1", "time": 5.0, "kind": "job_submitted", "job": "j",
                             "node": None, "cause": None, "detail": ""}
    a = Action("a1", ActionKind.PLACE, "j", (DeviceRef("n", 0),), cause="e1")
    r = a.to_record()
    assert r["type"] == "action" and r["placement"] == [["n", 0]] and r["cause"] == "e1" and r["live"]


def test_view_is_read_only() -> None:
    v = ClusterView(Topology.uniform(1, 1), {"j": JobView("j", 1, Tier.BASIC, 0.0)})
    with pytest.raises(TypeError):
        v.jobs["k"] = v.jobs["j"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        v.generation = 3  # type: ignore[misc]
