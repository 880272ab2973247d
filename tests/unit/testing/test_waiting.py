"""wait_until: returns what the condition returned, fails after its timeout saying what it waited for and
what it last saw; wait_for_line."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tidal.errors import TidalError, ValidationError
from tidal.testing import WaitTimeout, wait_for_line, wait_until


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, [], {"state": "running"}, {"state": "later"}])
    assert wait_until(lambda: next(answers), timeout=5, what="a job", interval=0.001) == {"state": "running"}
    assert next(answers) == {"state": "later"}  # not called again once it held


def test_a_condition_that_holds_at_once_is_called_once_and_never_waits() -> None:
    calls = []

    def cond() -> str:
        calls.append(1)
        return "yes"

    assert wait_until(cond, timeout=0, what="anything") == "yes"
    assert calls == [1]


def test_times_out_saying_what_for_how_long_and_the_last_value() -> None:
    values = iter(range(1000))
    with pytest.raises(WaitTimeout) as err:
        wait_until(lambda: next(values) > 10**6 and "never", timeout=0.05, what="the counter to pass a million",
                   interval=0.01)
    e = err.value
    assert isinstance(e, TidalError)
    message = str(e)
    assert message.startswith("timed out after 0.")
    assert "(timeout 0.05s, " in message and " tries) waiting for the counter to pass a million; " in message
    assert message.endswith("the last try returned False")
    assert e.what == "the counter to pass a million" and e.timeout == 0.05 and e.elapsed >= 0.05
    assert e.tries >= 2 and e.last_value is False and e.last_error is None and e.__cause__ is None
    assert e.to_dict()["what"] == "the counter to pass a million"


def test_an_exception_is_not_yet_and_is_reported_as_the_last_error() -> None:
    tries = []

    def cond() -> bool:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("refused")
        return True

    assert wait_until(cond, timeout=5, what="the server", interval=0.001) is True
    assert len(tries) == 3

    def refused() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimeout, match=r"waiting for the server; the last try raised "
                                          r"ConnectionError\('refused'\)$") as err:
        wait_until(refused, timeout=0.02, what="the server", interval=0.005)
    assert isinstance(err.value.last_error, ConnectionError) and err.value.__cause__ is err.value.last_error


def test_an_earlier_error_is_named_when_the_last_try_returned() -> None:
    tries = []

    def cond() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise KeyError("placement")

    with pytest.raises(WaitTimeout, match=r"returned None \(an earlier one raised KeyError\('placement'\)\)$"):
        wait_until(cond, timeout=0.02, what="a placement", interval=0.005)


def test_long_errors_are_cut_in_the_message() -> None:
    def cond() -> bool:
        raise ValueError("x" * 10_000)

    with pytest.raises(WaitTimeout) as err:
        wait_until(cond, timeout=0, what="nothing")
    assert len(str(err.value)) < 600 and str(err.value).endswith("xxx...")
    assert len(str(err.value.last_error)) == 10_000


def test_waits_for_another_thread() -> None:
    done = threading.Event()
    timer = threading.Timer(0.05, done.set)
    timer.start()
    try:
        assert wait_until(done.is_set, timeout=10, what="the timer", interval=0.005) is True
    finally:
        timer.cancel()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValidationError, match="timeout must be at least 0, got -1"):
        wait_until(lambda: True, timeout=-1, what="x")
    with pytest.raises(ValidationError, match="interval must be more than 0, got 0"):
        wait_until(lambda: True, timeout=1, what="x", interval=0)


def test_wait_for_line_waits_for_the_file_and_the_line(tmp_path: Path) -> None:
    log = tmp_path / "log"

    def write() -> None:
        log.write_text("step 1\nstep 2\n")

    timer = threading.Timer(0.05, write)
    timer.start()
    try:
        m = wait_for_line(log, r"^step (\d)$", timeout=10)
    finally:
        timer.cancel()
    assert m.group(1) == "1"
    with pytest.raises(WaitTimeout, match=r"waiting for '\^step 3\$' in .*log; the last try returned None"):
        wait_for_line(log, r"^step 3$", timeout=0.02)
