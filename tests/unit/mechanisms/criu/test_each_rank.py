"""The ranks of a job are dumped and restored several at a time (logic only: the work here is a sleep, not
CRIU): results in the ranks' order, every call over before the first failure is raised, and what succeeded
handed back so that the caller can undo it."""

from __future__ import annotations

import threading
import time

import pytest

from tidal.mechanisms.criu import job as jobmod


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobmod.os, "cpu_count", lambda: 2)


def test_results_in_order_and_at_most_a_core_each() -> None:
    running, most = [0], [0]
    mu = threading.Lock()

    def work(i: int) -> int:
        with mu:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05 * (4 - i))  # the first ends last
        with mu:
            running[0] -= 1
        return i * 10

    assert jobmod._each([0, 1, 2, 3], work) == [0, 10, 20, 30]
    assert most[0] == 2


def test_a_failure_is_raised_once_every_call_ended_and_the_rest_are_handed_back() -> None:
    ended: list[int] = []

    def work(i: int) -> int:
        if i == 1:
            raise RuntimeError("rank 1: criu restore failed")
        time.sleep(0.05)
        ended.append(i)
        return i

    done: list[int] = []
    with pytest.raises(RuntimeError, match="rank 1: criu restore failed"):
        jobmod._each([0, 1, 2], work, done=done)
    assert sorted(ended) == [0, 2] and sorted(done) == [0, 2]


def test_one_core_runs_them_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobmod.os, "cpu_count", lambda: 1)
    order: list[int] = []
    done: list[int] = []

    def work(i: int) -> int:
        order.append(i)
        if i == 2:
            raise ValueError("boom")
        return i

    with pytest.raises(ValueError, match="boom"):
        jobmod._each([0, 1, 2, 3], work, done=done)
    assert order == [0, 1, 2] and done == [0, 1]
