"""Singularity's tier attainment as one pure function, which the simulator and the live control plane's metrics
share: GPU-time weighted, 1 with nothing to weigh."""

from __future__ import annotations

from tidal.sim.metrics import weighted_attainment


def test_weighted_by_ranks() -> None:
    # a 1-rank job that ran all the time, a 3-rank job that ran half of it
    assert weighted_attainment([(1, 10.0, 10.0), (3, 5.0, 10.0)]) == (10 + 15) / (10 + 30)


def test_nothing_to_weigh_is_met() -> None:
    assert weighted_attainment([]) == 1.0
    assert weighted_attainment([(2, 0.0, 0.0)]) == 1.0
