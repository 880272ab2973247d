"""What the demos share (tidal.mechanisms.demo): the example scripts, polling with a deadline, a state
directory. The demos themselves run in tests/system/test_demo.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.errors import ConfigError
from tidal.mechanisms import demo
from tidal.waiting import WaitTimeout


def test_the_example_scripts_are_found_in_the_checkout() -> None:
    assert demo.example_script("train.py").is_file()
    with pytest.raises(ConfigError) as err:
        demo.example_script("no-such-example.py")
    assert "examples/no-such-example.py" in err.value.message and err.value.hint


def test_until_returns_what_the_check_found() -> None:
    answers = iter([None, 0, {"state": "running"}])
    assert demo.until("the job", lambda: next(answers)) == {"state": "running"}


def test_until_says_what_it_waited_for() -> None:
    with pytest.raises(WaitTimeout, match="waiting for the job to run") as err:
        demo.until("the job to run", lambda: False, timeout=0)
    assert err.value.hint


@pytest.mark.skipif(os.geteuid() != 0, reason="the demos need root")
def test_each_demo_run_gets_a_fresh_directory(tmp_path: Path) -> None:
    a, b = demo.demo_dir(tmp_path / "home", "demo-"), demo.demo_dir(tmp_path / "home", "demo-")
    assert a != b and a.parent == b.parent == tmp_path / "home" and not any(a.iterdir())
