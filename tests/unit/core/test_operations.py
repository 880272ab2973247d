"""The operation phase table: every step it allows is taken, every other one raises, and the table is
closed (every phase is reachable from idle and leads back to it)."""

from __future__ import annotations

import itertools
import typing

import pytest

from tidal.core import protocol
from tidal.core.operations import AWAITS, STEPS, Phase, can_step, step
from tidal.errors import Conflict


@pytest.mark.parametrize(("current", "new"), list(itertools.product(Phase, Phase)),
                         ids=lambda p: p.value)
def test_every_step_is_allowed_exactly_when_the_table_says(current: Phase, new: Phase) -> None:
    if new in STEPS[current]:
        assert can_step(current, new)
        assert step(current, new, job="j1") is new
    else:
        assert not can_step(current, new)
        with pytest.raises(Conflict) as e:
            step(current, new, job="j1")
        assert e.value.message == f"job j1: its operation cannot go from phase {current.value} to {new.value}"
        assert e.value.fields == {"job": "j1", "phase": current.value, "target": new.value}
        assert e.value.hint is not None and e.value.hint.startswith(f"allowed from {current.value}: ")


def _reachable(start: Phase) -> set[Phase]:
    seen, todo = {start}, [start]
    while todo:
        for n in STEPS[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_every_phase_is_reachable_from_idle_and_returns_to_it() -> None:
    assert set(STEPS) == set(Phase)
    assert _reachable(Phase.IDLE) == set(Phase)
    for p in Phase:
        assert Phase.IDLE in _reachable(p), p


def test_a_rank_failure_is_taken_in_every_phase_and_settles_only_to_idle() -> None:
    for p in Phase:
        assert Phase.IDLE in STEPS[p]  # the job lost, requeued or ended: the operation is abandoned
        if p is not Phase.FAILING:
            assert Phase.FAILING in STEPS[p]
    assert STEPS[Phase.FAILING] == {Phase.IDLE}


def test_the_multi_node_checkpoint_goes_cut_park_dump_finish() -> None:
    assert STEPS[Phase.CUT] >= {Phase.PARK, Phase.FINISH}
    assert STEPS[Phase.PARK] >= {Phase.DUMP, Phase.FINISH}
    assert STEPS[Phase.DUMP] >= {Phase.FINISH}
    assert Phase.DUMP not in STEPS[Phase.CUT]  # the park cannot be skipped


def test_a_park_round_that_raised_the_targets_is_followed_by_another() -> None:
    assert step(Phase.PARK, Phase.PARK) is Phase.PARK
    assert Phase.CUT not in STEPS[Phase.PARK]  # the counts are taken once: raises only add to them


def test_each_phase_awaits_orders_of_the_protocol() -> None:
    kinds = set(typing.get_args(protocol.OrderKind))
    assert set(AWAITS) == set(Phase)
    assert set().union(*AWAITS.values()) <= kinds
    # Every order the control plane tracks as an operation's step is awaited by some phase (kill and unstage
    # are not steps: they are untracked side orders; so is a prestage, but for a pre-copy's).
    assert set().union(*AWAITS.values()) == kinds - {"kill", "unstage"}
    assert AWAITS[Phase.PRECOPY] == {"prestage"}
