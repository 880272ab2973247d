"""``tidal agent --devices``: a number of CPU devices or ``auto`` (one per NVIDIA GPU), checked before the agent
starts. Logic only: the agent is not started (its exec is caught) and no GPU is looked for."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tidal.cli import deploy
from tidal.errors import ValidationError


def app() -> typer.Typer:
    a = typer.Typer()
    deploy.register(a)
    return a


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    argvs: list[list[str]] = []
    monkeypatch.setattr(deploy, "_exec", lambda module, args, env: argvs.append([module, *args]))
    return argvs


def _agent(tmp_path: Path, *devices: str) -> list[str]:
    return ["agent", "--server", "http://127.0.0.1:1", "--name", "n1", "--root", str(tmp_path), *devices]


@pytest.mark.parametrize(("given", "passed"), [((), "1"), (("--devices", "auto"), "auto"), (("--devices", "4"), "4")])
def test_the_agent_is_started_with_the_devices_given(tmp_path: Path, started: list[list[str]],
                                                     given: tuple[str, ...], passed: str) -> None:
    r = CliRunner().invoke(app(), _agent(tmp_path, *given))
    assert r.exit_code == 0, r.output
    (argv,) = started
    assert argv[0] == "tidal.agent" and argv[argv.index("--devices") + 1] == passed


@pytest.mark.parametrize(("value", "message"), [
    ("gpu", "--devices 'gpu': give a number of CPU devices, or auto (one device per NVIDIA GPU)"),
    ("0", "--devices 0: a node offers from 1 to 256 devices"),
])
def test_a_bad_devices_value_is_refused_saying_what_to_give(tmp_path: Path, started: list[list[str]], value: str,
                                                            message: str) -> None:
    r = CliRunner().invoke(app(), _agent(tmp_path, "--devices", value))
    assert not started
    assert isinstance(r.exception, ValidationError) and r.exception.message == message
