"""A job's spec in the database's form (JobSpec.to_json / from_json) and in a submission's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tidal.core import JobSpec, Tier, limits
from tidal.errors import ValidationError


def legacy_spec_to_json(spec: JobSpec) -> dict[str, Any]:
    """What the control plane stored for a job before JobSpec.to_json (control/jobs.py's spec_to_json)."""
    return {
        "name": spec.name, "command": list(spec.command), "workdir": spec.workdir, "ranks": spec.ranks,
        "tier": spec.tier.value, "min_devices": spec.min_devices, "max_devices": spec.max_devices,
        "env": dict(spec.env), "checkpoint_every": spec.checkpoint_every, "max_restarts": spec.max_restarts,
        "owner": spec.owner, "project": spec.project, "distributed": spec.distributed,
    }


SPECS = [
    JobSpec(command=["python", "train.py"], workdir="/w"),
    JobSpec(name="big", command=("torchrun", "x.py"), workdir="/w", ranks=8, tier="premium", min_devices=2,
            max_devices=4, env={"LR": "0.1", "PATH": "/bin"}, checkpoint_every=30.0, max_restarts=0,
            owner="alice", project="vision"),
    JobSpec(command=["sh", "-c", "echo hi"], workdir="/w", tier=Tier.STANDARD, ranks=3, checkpoint_every=1e-3),
]


@pytest.mark.parametrize("spec", SPECS)
def test_to_json_is_what_the_database_held_before(spec: JobSpec) -> None:
    doc = spec.to_json()
    # The pins and the run time came later: jobs stored before have none, and read back without (see the test
    # below).
    assert doc == {**legacy_spec_to_json(spec), "region": None, "cluster": None, "runtime": None}
    assert type(doc["command"]) is list and type(doc["env"]) is dict and type(doc["tier"]) is str


@pytest.mark.parametrize("spec", SPECS)
def test_from_json_gives_the_spec_back(spec: JobSpec) -> None:
    assert JobSpec.from_json(spec.to_json()) == spec


def test_from_json_reads_what_older_versions_stored() -> None:
    # Fields missing or null take their defaults; unknown keys are left out.
    old = JobSpec.from_json({"name": "t", "command": ["train"], "workdir": "/w", "ranks": 4, "tier": "basic",
                             "min_devices": None, "max_devices": None, "env": None, "someday": 1})
    assert (old.min_devices, old.max_devices, old.max_restarts, old.project, old.owner) == (1, 4, 3, "default", "")
    assert (old.region, old.cluster) == (None, None)
    assert old.tier is Tier.BASIC and dict(old.env) == {} and old.checkpoint_every is None
    # Not validated again: a job stored before a limit was tightened stays readable.
    over = JobSpec.from_json({**SPECS[0].to_json(), "ranks": limits.MAX_RANKS + 1, "max_devices": None,
                              "env": {"TIDAL_TOKEN": "x"}})
    assert over.ranks == over.max_devices == limits.MAX_RANKS + 1 and dict(over.env) == {"TIDAL_TOKEN": "x"}
    with pytest.raises(ValidationError) as e:
        JobSpec.from_json({"name": "t", "workdir": "/w"})
    assert e.value.fields["field"] == "command"


def test_a_job_is_named_for_what_it_runs_by_default() -> None:
    assert JobSpec(command=["/usr/bin/python3", "x.py"], workdir="/w").name == "x"
    assert JobSpec(command=["train"], workdir="/w", name="").name == "train"
    with pytest.raises(ValidationError) as e:
        JobSpec(command=["train"], workdir="/w", name=" ")
    assert e.value.fields["field"] == "name"


def test_the_submission_is_every_field_but_the_owner() -> None:
    fields = {f.name: f for f in JobSpec.submission_fields()}
    assert list(fields) == [f.name for f in dataclasses.fields(JobSpec) if f.name not in ("owner", "distributed")]
    assert fields["command"].required and fields["workdir"].required
    assert not fields["name"].required and fields["name"].default is None
    assert fields["tier"].type is str and fields["tier"].default == "basic"
    assert fields["env"].default_factory is dict and fields["ranks"].default is None
    spec = JobSpec.submitted({"command": ["a/b"], "workdir": "/w", "name": None, "tier": "premium"}, owner="bob")
    assert (spec.name, spec.tier, spec.owner) == ("b", Tier.PREMIUM, "bob")


def test_ranks_given_even_one_means_torchrun_s_environment() -> None:
    plain = JobSpec.submitted({"command": ["python", "t.py"], "workdir": "/w", "ranks": None}, owner="bob")
    one = JobSpec.submitted({"command": ["python", "t.py"], "workdir": "/w", "ranks": 1}, owner="bob")
    four = JobSpec.submitted({"command": ["python", "t.py"], "workdir": "/w", "ranks": 4}, owner="bob")
    assert (plain.ranks, plain.torchrun) == (1, False)
    assert (one.ranks, one.torchrun) == (1, True)
    assert four.torchrun
    # Stored before `distributed` was: jobs of several ranks keep torchrun's environment.
    old = {k: v for k, v in four.to_json().items() if k != "distributed"}
    assert JobSpec.from_json(old).torchrun and not JobSpec.from_json({**old, "ranks": 1}).torchrun
