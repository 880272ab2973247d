"""The work the interposer hands out for each op: one wait() on the inner work at a time and none after one
returned (a second wait() on a gloo send or receive blocks for ever), the cut's list of works pruned, and every
work letting go of its inner one at a teardown. With stand-ins for torch's ``Work`` and the inner works."""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tidal.mechanisms.interpose import rankside


class Inner:
    """An inner work whose wait() blocks until ``release`` is set, then answers from ``answers`` in turn (an
    exception is raised); like gloo's point-to-point works, it says it completed only once waited on."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers) or [True]
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.completed = False

    def wait(self, timeout: Any = None) -> bool:
        self.calls += 1
        self.entered.set()
        if not self.release.wait(10):
            raise AssertionError("the test never released the inner wait()")
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        self.completed = bool(answer)
        return bool(answer)

    def is_completed(self) -> bool:
        return self.completed

    def result(self) -> list[str]:
        return ["tensor"]


@pytest.fixture
def work_cls(monkeypatch: pytest.MonkeyPatch) -> type:
    monkeypatch.setattr(rankside, "_WORK_TYPES", [])
    return rankside._make_work_class(SimpleNamespace(Work=object))


def make(work_cls: type, inner: Inner, p2p: bool = True) -> Any:
    work = work_cls()
    work._w = inner
    work._p2p = p2p
    return work


def test_a_second_wait_while_one_runs_waits_for_it_and_the_inner_work_is_waited_on_once(
        work_cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    inner = Inner()
    work = make(work_cls, inner)
    polling = threading.Event()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        polling.set()  # the second wait() is in its loop, waiting for the first
        real_sleep(seconds)

    monkeypatch.setattr(rankside.time, "sleep", sleep)
    results: dict[str, bool] = {}
    first = threading.Thread(target=lambda: results.update(first=work.wait()))
    first.start()
    assert inner.entered.wait(5)
    second = threading.Thread(target=lambda: results.update(second=work.wait()))
    second.start()
    assert polling.wait(5)
    assert "second" not in results
    inner.release.set()
    first.join(5)
    second.join(5)
    assert results == {"first": True, "second": True}
    assert inner.calls == 1
    assert work.wait() is True and inner.calls == 1
    assert work.is_completed()


def test_a_wait_that_failed_or_timed_out_leaves_the_work_to_the_next_wait(work_cls: type) -> None:
    inner = Inner(RuntimeError("connection reset"), False, True)
    inner.release.set()
    work = make(work_cls, inner)
    with pytest.raises(RuntimeError, match="connection reset"):
        work.wait()
    assert work.wait(datetime.timedelta(seconds=1)) is False
    assert not work.is_completed()
    assert work.wait() is True
    assert inner.calls == 3
    assert work.is_completed() and work.wait() is True and inner.calls == 3


def test_waiting_longer_than_the_timeout_on_a_work_another_thread_waits_on_fails(work_cls: type) -> None:
    inner = Inner()
    work = make(work_cls, inner)
    first = threading.Thread(target=work.wait)
    first.start()
    assert inner.entered.wait(5)
    try:
        with pytest.raises(RuntimeError, match="timed out waiting for a work that another thread waits on"):
            work.wait(datetime.timedelta(milliseconds=50))
    finally:
        inner.release.set()
        first.join(5)
    assert inner.calls == 1


class Computed:
    """An object that computes its ``__class__``, with a side effect, as torch's deprecated ``reduce_op`` warns."""

    asked = 0

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        Computed.asked += 1
        return Computed


def test_every_work_lets_go_of_its_inner_work_at_a_teardown(work_cls: type) -> None:
    waited, kept = Inner(), Inner()
    waited.release.set()
    works = [make(work_cls, waited), make(work_cls, kept, p2p=False)]
    works[0].wait()
    computed = [Computed()]  # in a list: tracked by the collector, as the objects the teardown looks through
    rankside._let_go_of_works()
    assert [w._w for w in works] == [None, None]
    assert Computed.asked == 0, "the teardown read an object's __class__ (a script would see its side effects)"
    del computed
    # What the script may still ask of a work it kept, answered without the inner work (its group is gone).
    assert [(w.wait(), w.is_completed(), w.result()) for w in works] == [(True, True, []), (True, True, [])]
    assert kept.calls == 0


@pytest.fixture
def interposer() -> Iterator[rankside.Interposer]:
    req_r, req_w = os.pipe()
    yield rankside.Interposer(req_r, req_w, None, "test")
    os.close(req_r)
    os.close(req_w)


def test_the_cuts_list_of_works_drops_those_done_once_it_has_doubled(work_cls: type,
                                                                     interposer: rankside.Interposer) -> None:
    ip = interposer
    done = Inner()
    done.release.set()
    waited = [make(work_cls, done) for _ in range(4)]
    for w in waited:
        w.wait()
    completed = Inner()
    completed.completed = True  # a collective torch says completed, never waited on
    open_ = [make(work_cls, Inner()) for _ in range(3)]
    for w in [*waited, make(work_cls, completed, p2p=False), *open_[:2]]:
        ip.enter("g", [0, 1])
        ip.leave("g", w)
    assert len(ip.works) == 7  # kept until the list reaches its bound (8)
    ip.enter("g", [0, 1])
    ip.leave("g", open_[2])
    assert ip.works == open_
    assert ip._prune_at == 2 * 3 + 8
    assert ip.announced == ip.issued == {"g": 8}
