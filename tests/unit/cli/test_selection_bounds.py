"""The CLI's copies of the API's bounds and of the unfinished states (`tidal ls` does not import the core model
for them) are the core's own."""

from __future__ import annotations

from tidal.cli import selection
from tidal.core import TERMINAL, JobState, limits


def test_the_cli_s_bounds_and_states_are_the_core_s() -> None:
    assert (selection.MAX_PAGE, selection.MAX_BULK) == (limits.MAX_PAGE, limits.MAX_BULK)
    assert selection.PAGE <= selection.MAX_PAGE
    assert sorted(selection.UNFINISHED) == sorted(s.value for s in JobState if s not in TERMINAL)
