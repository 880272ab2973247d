"""A node's park rounds of a cut across nodes: a newer round of the same cut supersedes an older one, and a
new cut (another epoch, which is random, not increasing) is never taken for an old round."""

from __future__ import annotations

from typing import Any

import pytest

from tidal.core.cutplan import Plan
from tidal.mechanisms.criu import job as jobmod
from tidal.mechanisms.criu.job import Job


def test_a_new_cut_with_a_smaller_epoch_parks_and_an_older_round_of_the_same_cut_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rounds: list[tuple[int, int]] = []

    def park_round(channels: Any, epoch: int, plan: Plan, timeout: float, superseded: Any) -> list[Any]:
        rounds.append((epoch, plan.version))
        return []

    monkeypatch.setattr(jobmod, "park_round", park_round)
    job = Job("j", [], None, None)  # type: ignore[arg-type]  # no ranks: only the rounds' order is looked at
    job.park(900, Plan(version=0))
    job.park(900, Plan(version=2))
    job.park(900, Plan(version=1))  # came late: superseded by version 2, not run
    job.park(12, Plan(version=0))  # the next cut: its epoch is smaller, it parks all the same
    job.supersede(12, 3)
    job.park(12, Plan(version=2))  # superseded by the announced version 3
    job.park(12, Plan(version=3))
    assert rounds == [(900, 0), (900, 2), (12, 0), (12, 3)]
