"""Admission of premium and standard jobs against per-project quotas: the pure rule, its inputs, and
what the simulator makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.cli.test_sim import app
from tests.unit.sim.test_engine import UNIT
from tidal.core import Tier, Topology
from tidal.errors import ValidationError
from tidal.policy import make_policy
from tidal.policy.admission import Admission, Quotas, parse_quotas
from tidal.sim.engine import Simulator
from tidal.sim.metrics import summarize
from tidal.sim.quota_spec import parse_quota_option
from tidal.sim.trace import TraceJob

B, S, P = Tier.BASIC, Tier.STANDARD, Tier.PREMIUM


def test_guaranteed_jobs_are_admitted_up_to_the_quota_and_demoted_beyond() -> None:
    adm = Admission(Quotas({"a": 0.5, "*": 0.25}), capacity=8)  # a: 4 devices, others: 2
    assert adm.admit("j1", "a", P, 3).tier is P
    d = adm.admit("j2", "a", S, 2)  # 3 + 2 > 4
    assert d.tier is B and d.requested is S and d.demoted
    assert d.reason == "project 'a' has 3 of its 4 guaranteed devices admitted; 2 more would exceed its quota"
    assert adm.admit("j3", "a", S, 1).tier is S  # 3 + 1 = 4 fits
    assert adm.admit("j4", "a", B, 8).tier is B and not adm.admit("j5", "a", B, 8).demoted  # basic: no quota
    assert adm.admit("j6", "other", S, 2).tier is S and adm.admit("j7", "other", S, 1).tier is B
    adm.finished("j1")
    assert adm.used("a") == 1 and adm.admit("j8", "a", P, 3).tier is P
    adm.finished("j2")  # a demoted job held nothing
    adm.finished("unknown")
    assert adm.used("a") == 4


def test_projects_without_a_quota_are_not_limited() -> None:
    adm = Admission(Quotas({"a": 0.1}), capacity=8)
    assert all(adm.admit(f"j{i}", "b", P, 8).tier is P for i in range(3))


@pytest.mark.parametrize(("text", "message"), [
    ("a", "bad quota 'a': expected project=share"),
    ("a=x", "bad quota 'a=x': 'x' is not a number"),
    ("a=0.5,a=0.2", "project 'a' has two quotas"),
    ("a=1.5", "quota of project 'a' must be a share between 0 and 1, got 1.5"),
    (" , ", "empty quota specification"),
])
def test_bad_quota_specifications_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_quotas(text)
    assert e.value.message == message


def test_quota_option_takes_shares_or_a_vc_file(tmp_path: Path) -> None:
    assert parse_quota_option("a=0.5,*=0.25", 0.8).shares == {"a": 0.4, "*": 0.2}
    vc = tmp_path / "vc.csv"
    vc.write_text("vc,node num\nx,3\ny,1\n")
    assert parse_quota_option(str(vc)).shares == {"x": 0.75, "y": 0.25}
    with pytest.raises(ValidationError, match="neither project=share"):
        parse_quota_option(str(tmp_path / "missing.csv"))
    with pytest.raises(ValidationError, match="quota-scale must be in"):
        parse_quota_option("a=0.5", 0.0)


def test_the_simulator_runs_jobs_over_quota_as_basic_and_reports_them() -> None:
    # One node of 2 devices; project a may hold 1 guaranteed device. j0 (standard, 1 device) is admitted;
    # j1 (standard, 1) arrives while j0 is unfinished and runs as basic; j2 (premium) then preempts it.
    trace = [TraceJob("j0", 0, 100, 1, S, "a"), TraceJob("j1", 10, 100, 1, S, "a"),
             TraceJob("j2", 20, 50, 1, P, "b")]
    events: list[dict[str, object]] = []
    r = Simulator(Topology.uniform(1, 2), trace, make_policy("singularity"), cost=UNIT,
                  admission=Admission(Quotas({"a": 0.5}), 2), log=events.append).run()
    js = {j.id: j for j in r.jobs}
    assert (js["j0"].tier, js["j1"].tier, js["j2"].tier) == (S, B, P)
    assert js["j1"].requested is S and js["j1"].preemptions == 1
    assert [e["detail"] for e in events if e.get("kind") == "job_submitted"] == [
        "", "admitted as basic: project 'a' has 1 of its 1 guaranteed devices admitted; 1 more would exceed "
            "its quota", ""]
    s = summarize(r)
    assert s["sla"]["standard"]["jobs"] == 1 and s["sla"]["basic"]["jobs"] == 1
    adm = s["admission"]["standard"]
    assert (adm["requested"], adm["demoted"], adm["demoted_work_fraction"]) == (2, 1, 0.5)
    ideal, real = 100 + 100, (js["j0"].finish or 0) + (js["j1"].finish or 0) - 10
    assert adm["requested_attainment"] == pytest.approx(ideal / real)


def test_sim_cli_quota(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus,tier,project\n0,100,1,standard,a\n10,100,1,standard,a\n")
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--workers", "1",
                                   "--policies", "singularity", "--quota", "a=0.5", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "admitted as basic (over quota): standard 1 of 2" in r.output
    doc = json.loads(out.read_text())
    assert doc["input"]["quotas"] == {"a": 0.5}
    assert doc["policies"]["singularity"]["admission"]["standard"]["demoted"] == 1
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x2", "--policies", "fifo",
                                   "--quota", "a=2"])
    assert r.exit_code != 0 and "between 0 and 1" in str(r.exception)
