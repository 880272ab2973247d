"""Admission against the load: the estimate, and what each mode does with a job that would miss its SLA."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.cli.test_sim import app
from tidal.core import Tier
from tidal.errors import ValidationError
from tidal.policy.sla_admission import SlaAdmission, SlaDecision, decide_sla, estimate

P, S, B = Tier.PREMIUM, Tier.STANDARD, Tier.BASIC


def test_estimate_is_duration_over_wait_plus_duration() -> None:
    assert estimate(100.0, 0.0, 8) == 1.0
    assert estimate(100.0, 800.0, 8) == pytest.approx(0.5)  # 800 device-s over 8 devices: 100 s of wait
    assert estimate(0.0, 1e9, 8) == 1.0


def test_each_mode_on_a_standard_job_behind_a_backlog() -> None:
    backlog = {P: 400.0, S: 1200.0, B: 1e9}  # basic work is not ahead of a guaranteed job
    # Standard waits (400 + 1200) / 8 = 200 s: 100 / 300 = 0.33 < 0.70.
    assert decide_sla("off", S, 100.0, backlog, 8) == SlaDecision("accepted", S, 1.0)
    d = decide_sla("refuse", S, 100.0, backlog, 8)
    assert d == SlaDecision("refused", S, pytest.approx(1 / 3), "refused: expected attainment 0.33 at standard "
                            "under the current load, below its target 0.70; submit later or at a lower tier")
    d = decide_sla("demote", S, 100.0, backlog, 8)
    assert (d.outcome, d.tier) == ("demoted", B)
    assert d.reason == "accepted as basic: expected attainment 0.33 at standard under the current load, below its " \
                       "target 0.70"
    # Premium waits only for premium: 400 / 8 = 50 s, 100 / 150 = 0.67 < 0.95; as standard 0.33 < 0.70: basic.
    assert decide_sla("demote", P, 100.0, backlog, 8).tier is B
    # A long job behind the same backlog meets the target: accepted as asked, with its estimate.
    d = decide_sla("refuse", S, 10_000.0, backlog, 8)
    assert d.outcome == "accepted" and d.estimate == pytest.approx(10_000 / 10_200)
    # Basic, and a job without a run time, are admitted as asked.
    assert decide_sla("refuse", B, 1.0, backlog, 8).outcome == "accepted"
    assert decide_sla("refuse", S, None, backlog, 8).outcome == "accepted"


def test_premium_demoted_to_standard_when_standard_would_meet_its_target() -> None:
    backlog = {P: 800.0, S: 0.0, B: 0.0}
    # Premium: 100 s wait → 0.5 < 0.95; standard also waits for premium → 0.5 < 0.70 → basic.
    assert decide_sla("demote", P, 100.0, backlog, 8).tier is B
    backlog = {P: 80.0, S: 0.0, B: 0.0}  # 10 s wait: premium 100/110 = 0.91 < 0.95, standard 0.91 ≥ 0.70
    assert decide_sla("demote", P, 100.0, backlog, 8).tier is S


def test_an_unknown_mode_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValidationError) as e:
        decide_sla("later", S, 1.0, {}, 8)  # type: ignore[arg-type]
    assert e.value.message == "unknown SLA admission 'later'" and e.value.hint == "one of: off, demote, refuse"


def test_no_wait_while_the_guaranteed_demand_fits_the_cluster() -> None:
    backlog = {P: 0.0, S: 1e9, B: 0.0}  # long standard jobs hold 6 of 8 devices
    assert decide_sla("refuse", S, 100.0, backlog, 8, {P: 0, S: 6, B: 0}, 2).outcome == "accepted"
    d = decide_sla("refuse", S, 100.0, backlog, 8, {P: 0, S: 6, B: 0}, 3)  # 9 > 8: behind the backlog
    assert d.outcome == "refused"
    assert decide_sla("refuse", P, 100.0, backlog, 8, {P: 0, S: 8, B: 0}, 3).outcome == "accepted"  # above them


def test_the_backlog_follows_admissions_and_finishes() -> None:
    a = SlaAdmission("refuse", 8)
    assert a.admit("j1", S, 8, 100.0).outcome == "accepted"
    assert a.backlog[S] == 800.0
    assert a.admit("j2", S, 1, 100.0).outcome == "refused"  # 100 s wait: 0.5
    assert a.backlog[S] == 800.0  # a refused job adds nothing
    a.finished("j1")
    assert a.backlog[S] == 0.0
    assert a.admit("j3", S, 1, 100.0).outcome == "accepted"


def test_sim_cli_admits_against_the_load(tmp_path: Path) -> None:
    # One device: the 1,000 s standard job is admitted; the 100 s one would wait ≈ 1,000 s (0.09 < 0.70).
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus,tier\n0,1000,1,standard\n10,100,1,standard\n")
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x1", "--workers", "1",
                                   "--policies", "fifo", "--admit-sla", "refuse"])
    assert r.exit_code == 0, r.output
    assert "fifo: admission against the load (refuse): standard: 0 demoted, 1 refused of 2" in r.output
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x1", "--admit-sla", "later"])
    assert r.exit_code != 0 and "--admit-sla must be one of off, demote, refuse, not 'later'" in str(r.exception)
