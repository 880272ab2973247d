"""Admission against the load: the estimate, and what each mode does with a job that would miss its SLA."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.cli.test_sim import app
from tidal.core import Tier
from tidal.errors import ValidationError
from tidal.policy.sla_admission import (
    Deferred,
    Release,
    SlaAdmission,
    SlaDecision,
    decide_sla,
    estimate,
    release,
    run_time_left,
)

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
    assert e.value.message == "unknown SLA admission 'later'" and e.value.hint == "one of: off, demote, refuse, defer"


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


def test_the_backlog_is_the_work_left_when_the_work_done_is_known() -> None:
    done = {"j1": 0.0}
    a = SlaAdmission("refuse", 8, done=done.__getitem__)
    assert a.admit("j1", S, 8, 100.0).outcome == "accepted"
    assert a.backlog[S] == 800.0 and a.demand[S] == 8
    assert a.admit("j2", S, 1, 100.0).outcome == "refused"  # 100 s wait: 0.50
    done["j1"] = 80.0  # 20 s of it left: a 20 s wait for 100 s of work, 0.83
    assert a.backlog[S] == 160.0
    assert a.admit("j3", S, 1, 100.0).outcome == "accepted"
    done["j3"] = 0.0
    done["j1"] = 150.0  # ran longer than it said: nothing left of it, never less than nothing
    assert a.backlog[S] == 100.0


def test_run_time_left_counts_the_service_over_the_ranks() -> None:
    assert run_time_left(None, 500.0, 2) is None  # no run time given: unknown
    assert run_time_left(3600.0, 3600.0, 2) == 1800.0  # 2 devices for 1,800 s
    assert run_time_left(3600.0, 3600.0, 4) == 2700.0  # 2 of 4 devices for 1,800 s: half speed
    assert run_time_left(100.0, 1e6, 1) == 0.0


def test_sim_cli_admits_against_the_load(tmp_path: Path) -> None:
    # One device: the 1,000 s standard job is admitted; the 100 s one would wait ≈ 1,000 s (0.09 < 0.70).
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus,tier\n0,1000,1,standard\n10,100,1,standard\n")
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x1", "--workers", "1",
                                   "--policies", "fifo", "--admit-sla", "refuse"])
    assert r.exit_code == 0, r.output
    assert "fifo: admission against the load (refuse): standard: 0 demoted, 1 refused of 2" in r.output
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x1", "--admit-sla", "later"])
    assert r.exit_code != 0 and "--admit-sla must be one of off, demote, refuse, defer, not 'later'" in str(r.exception)


def test_defer_keeps_the_tier_and_says_when_it_starts() -> None:
    backlog = {P: 400.0, S: 1200.0, B: 0.0}
    d = decide_sla("defer", S, 100.0, backlog, 8)
    assert d == SlaDecision("deferred", S, pytest.approx(1 / 3), "deferred: expected attainment 0.33 at standard "
                            "under the current load, below its target 0.70; it starts when that is met")
    assert decide_sla("defer", S, 10_000.0, backlog, 8).outcome == "accepted"
    # Behind an earlier deferred job of its tier it is deferred whatever its estimate: none overtakes.
    d = decide_sla("defer", S, 10_000.0, backlog, 8, deferred_ahead=1)
    assert (d.outcome, d.tier) == ("deferred", S)
    assert d.reason == ("deferred: behind 1 earlier deferred standard job(s) (expected attainment 0.98 at standard, "
                        "target 0.70); it starts after them, when its target is met")
    assert decide_sla("defer", B, 1.0, backlog, 8, deferred_ahead=3).outcome == "accepted"


def test_release_in_submission_order_each_behind_those_released_before_it() -> None:
    waiting = [Deferred("a", S, 100.0, 1), Deferred("b", S, 10.0, 1), Deferred("c", P, 100.0, 1)]
    backlog = {P: 0.0, S: 0.0, B: 0.0}
    # Nothing ahead: a is released (1.00); b then waits 100 s behind a on 1 device (10 / 110 = 0.09): held,
    # and c (premium, not behind standard work) is released at 1.00.
    assert release(waiting, backlog, 1) == [
        Release("a", 1.0, "released: expected attainment now 1.00 ≥ 0.70"),
        Release("c", 1.0, "released: expected attainment now 1.00 ≥ 0.95")]
    assert backlog == {P: 0.0, S: 0.0, B: 0.0}  # pure
    # A later job of the tier never overtakes an earlier one still held, even when it would meet its target.
    assert release([Deferred("a", S, 1.0, 1), Deferred("b", S, 1e6, 1)], {P: 0.0, S: 100.0, B: 0.0}, 1) == []


def test_a_deferred_job_counts_in_the_backlog_once_released() -> None:
    a = SlaAdmission("defer", 1)
    assert a.admit("j1", S, 1, 1000.0).outcome == "accepted"
    assert a.admit("j2", S, 1, 100.0).outcome == "deferred"  # 100 / 1100
    assert a.admit("j3", S, 1, 1e6).outcome == "deferred"  # behind j2
    assert a.backlog[S] == 1000.0 and [d.job_id for d in a.deferred] == ["j2", "j3"]
    assert a.release() == []
    a.finished("j1")
    # j2 first (1.00), then j3 behind it (1e6 / (1e6 + 100) ≥ 0.70); both now count.
    assert [r.job_id for r in a.release()] == ["j2", "j3"]
    assert a.backlog[S] == 100.0 + 1e6 and a.deferred == []


def test_sim_cli_defers_and_reports_the_deferral(tmp_path: Path) -> None:
    # One device: the 100 s job is deferred at 10 and released when the 1,000 s one finishes: 990 s deferred.
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,num_gpus,tier\n0,1000,1,standard\n10,100,1,standard\n")
    r = CliRunner().invoke(app(), ["sim", "--trace", str(trace), "--cluster", "1x1", "--workers", "1",
                                   "--policies", "fifo", "--admit-sla", "defer"])
    assert r.exit_code == 0, r.output
    assert ("fifo: admission against the load (defer): standard: 0 demoted, 0 refused of 2, 1 deferred (mean 990 s)"
            in r.output)
