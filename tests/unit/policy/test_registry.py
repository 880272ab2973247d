"""The policy registry: the one place that maps a name to a policy, for the simulator and the live
control plane; nothing outside :mod:`tidal.policy` decides by a policy's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tidal
from tidal.control import server
from tidal.core import ActionKind, ClusterView, JobView, Tier, Topology
from tidal.errors import ValidationError
from tidal.policy.firstfit import FirstFitPolicy
from tidal.policy.registry import (
    DEFAULT_LIVE_POLICY,
    LIVE_POLICIES,
    POLICIES,
    make_live_policy,
    make_policy,
)
from tidal.policy.singularity import Singularity, SingularityConfig

SRC = Path(tidal.__file__).parent


def test_the_names_are_those_the_simulator_and_the_cluster_offer() -> None:
    assert list(POLICIES) == ["fifo", "priority-requeue", "tiresias", "gandiva", "singularity", "sjf", "srtf",
                              "firstfit"]
    assert LIVE_POLICIES == ("singularity", "firstfit")
    assert DEFAULT_LIVE_POLICY == "singularity"


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_name_builds_a_fresh_policy_of_that_name(name: str) -> None:
    p, q = make_policy(name), make_policy(name)
    assert p is not q  # a policy keeps state between decisions: never shared
    assert p.name == name
    view = ClusterView(Topology.uniform(1, 2), {"j": JobView("j", 1, Tier.BASIC, 0.0)})
    (a,) = p.decide(view, [], 10.0)
    assert (a.kind, a.job_id) == (ActionKind.PLACE, "j")


def test_live_names_build_their_live_configuration() -> None:
    live = make_live_policy("singularity")
    assert isinstance(live, Singularity)
    assert live.cfg == SingularityConfig(min_run_s=5.0, shrink=True, grow=True, time_slice=False, defrag=False,
                                         shrunk_start_tiers=(1, 2), backfill=True)
    assert live.grows
    sim = make_policy("singularity")
    # The simulator evaluates the defaults plus ordering among equals and shrunk guaranteed starts.
    assert isinstance(sim, Singularity) and sim.cfg == SingularityConfig(equal_preempt_tiers=(0, 1, 2),
                                                                      shrunk_start_tiers=(1, 2),
                                                                      short_lane_share=0.35, backfill=True)
    ff = make_live_policy("firstfit")
    assert isinstance(ff, FirstFitPolicy) and not ff.grows
    default = make_live_policy()
    assert isinstance(default, Singularity) and default.cfg == live.cfg


def test_an_unknown_name_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValidationError) as e:
        make_policy("lottery")
    assert e.value.message == "unknown policy 'lottery'"
    assert e.value.hint == "valid policies: " + ", ".join(POLICIES)


@pytest.mark.parametrize(("name", "message"), [
    ("lottery", "unknown policy 'lottery'"),
    ("fifo", "policy 'fifo' runs in the simulator only: it cannot drive a live cluster"),
])
def test_a_name_that_cannot_drive_a_live_cluster_is_refused_with_the_live_ones(name: str, message: str) -> None:
    with pytest.raises(ValidationError) as e:
        make_live_policy(name)
    assert e.value.message == message
    assert e.value.hint == "policies for a live cluster: singularity, firstfit"


def test_the_control_plane_offers_the_live_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        server.main(["--policy", "fifo"])
    assert e.value.code == 2
    assert "choose from singularity, firstfit" in capsys.readouterr().err.replace("'", "")


def _decides_by_name(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that compare something with a policy's name (``x.policy.name == ...``, ``name == "firstfit"``,
    ``name in ("singularity", ...)``, ``case "firstfit":``)."""

    def names_a_policy(e: ast.expr) -> bool:
        if isinstance(e, ast.Constant):
            return e.value in names
        if isinstance(e, ast.Tuple | ast.List | ast.Set):
            return any(names_a_policy(x) for x in e.elts)
        return isinstance(e, ast.Attribute) and e.attr == "name" and "polic" in ast.unparse(e.value).lower()

    def decides(node: ast.AST) -> bool:
        if isinstance(node, ast.Compare):
            return any(map(names_a_policy, [node.left, *node.comparators]))
        return isinstance(node, ast.MatchValue) and names_a_policy(node.value)

    return [node.lineno for node in ast.walk(tree) if decides(node)]


def test_nothing_outside_the_policy_package_decides_by_a_policy_name() -> None:
    names = set(POLICIES)
    found = [f"{path.relative_to(SRC)}:{line}"
             for path in sorted(SRC.rglob("*.py")) if SRC / "policy" not in path.parents
             for line in _decides_by_name(ast.parse(path.read_text(encoding="utf-8")), names)]
    assert found == []


def test_the_guard_sees_a_decision_by_name() -> None:
    names = set(POLICIES)
    for code in ('if self.policy.name != "x": pass', 'ok = name == "firstfit"', 'ok = p in ("a", "singularity")',
                 'match name:\n    case "srtf":\n        pass'):
        assert _decides_by_name(ast.parse(code), names), code
    assert not _decides_by_name(ast.parse('if node.name == "x": pass\nlabel = "firstfit"'), names)
