"""What `tidal` imports to start: `tidal --version` nothing of the CLI, Typer or any other package; a command, its
own module alone; `tidal --help` every module, so that it lists every command. Held as sets of modules, read
from ``python -X importtime``, never as seconds (the seconds are benchmarks/cli_startup.py's, in
docs/cluster.md). The commands that talk to a control plane are held in tests/integration/cli/test_startup.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import import_module
from importlib.metadata import version
from pathlib import Path

import pytest
import typer

from tidal.cli.main import COMMANDS, NEEDS_ALL, command_name, modules_for
from tidal.cli.version import tidal_version
from tidal.testing.imports import imports_of

CLI = Path(__file__).resolve().parents[3] / "src" / "tidal" / "cli"
# Packages a command that does not need them must not import (each one's modules too).
HEAVY = ("typer", "rich", "pydantic", "pydantic_core", "pydantic_settings", "httpx", "httpcore", "yaml",
         "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "prometheus_client", "cryptography",
         "zstandard", "fsspec", "tidal.core", "tidal.config", "tidal.policy", "tidal.sim", "tidal.agent",
         "tidal.mechanisms")


def imported(*args: str) -> set[str]:
    """The modules ``tidal ARGS`` has imported when it exits (no control plane: TIDAL_HOME is empty)."""
    return imports_of("tidal.cli.main", *args, env={**os.environ, "TIDAL_HOME": "/nonexistent"})


def among(modules: set[str], packages: tuple[str, ...]) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


def test_version_imports_nothing_but_the_standard_library() -> None:
    p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "--version"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert (p.returncode, p.stdout, p.stderr) == (0, f"tidal {version('tidal')}\n", "")
    modules = imported("--version")
    assert {m for m in modules if m.split(".")[0] == "tidal"} == {"tidal", "tidal.cli", "tidal.cli.version"}
    at_start = imports_of(None)  # what this interpreter imports to start anyway
    outside = {m for m in modules - at_start if m.split(".")[0] not in sys.stdlib_module_names | {"tidal"}}
    assert outside == set()
    assert among(modules, HEAVY) == set()
    assert "importlib.metadata" not in modules  # the version is read from the metadata file itself


def test_the_version_is_the_installed_distributions() -> None:
    assert tidal_version() == version("tidal")
    # Root's eager --version, wherever it stands among tidal's own options, says the same (through Typer).
    p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "--url", "http://x", "--version"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert (p.returncode, p.stdout) == (0, f"tidal {version('tidal')}\n")


def test_a_command_imports_its_own_module_alone() -> None:
    modules = imported("ls", "--help")
    cli = {m.removeprefix("tidal.cli.") for m in modules if m.startswith("tidal.cli.")}
    assert "jobs" in cli and cli.isdisjoint(set(COMMANDS) - {"jobs", "completion", "logs"}), cli
    assert among(modules, HEAVY) == among(modules, ("typer",))  # Typer, for the help; no more
    assert among(imported("up", "--help"), ("tidal.config", "pydantic_settings", "tidal.control.localcluster")) \
        == set()  # `tidal up` imports the launcher and the settings when it runs, not for its help


def test_the_help_lists_every_command_at_a_fraction_of_the_imports() -> None:
    p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "--help"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0
    listed = re.findall(r"^  (\S+)", p.stdout.split("Commands:")[1], re.M)
    assert set(listed) == {n for names in COMMANDS.values() for n in names} - NEEDS_ALL  # cli-reference: hidden
    # Each module's heavy imports are made where its command runs (the settings, the checks, CRIU, Slurm).
    heavy = among(imported("--help"), ("tidal.config", "tidal.mechanisms", "tidal.agent", "tidal.control",
                                       "pydantic", "pydantic_settings", "httpx", "sqlalchemy", "fastapi"))
    # ... but `tidal demo`'s entry point, and the client the demo and the commands of jobs talk through.
    assert heavy == {"tidal.mechanisms", "tidal.mechanisms.demo", "tidal.mechanisms.criu",
                     "tidal.mechanisms.criu.provision", "tidal.control", "tidal.control.client",
                     "tidal.control.clusterfile"}


def _registered(module: str) -> set[str]:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, whatever the module registers
    import_module(f"tidal.cli.{module}").register(app)
    return set(typer.main.get_group(app).commands)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_the_table_of_commands_says_what_each_module_registers(module: str) -> None:
    registered = _registered(module)
    assert registered == set(COMMANDS[module]), (
        f"tidal.cli.main.COMMANDS[{module!r}] must name what tidal/cli/{module}.py registers: "
        f"{sorted(registered)}")


def test_every_module_that_registers_commands_is_in_the_table() -> None:
    modules = {p.stem for p in CLI.glob("*.py") if re.search(r"^def register\(", p.read_text(), re.M)}
    assert modules == set(COMMANDS), f"add each to tidal.cli.main.COMMANDS: {sorted(modules - set(COMMANDS))}"
    names = [n for ns in COMMANDS.values() for n in ns]
    assert len(names) == len(set(names)), "a command name belongs to one module"


def test_the_command_is_the_first_word_after_tidals_own_options() -> None:
    assert command_name(["ls", "-o", "json"]) == "ls"
    assert command_name(["--url", "http://x", "--token-file", "t", "show", "j"]) == "show"
    assert command_name(["--url=http://x", "--ca-fingerprint", "AB", "--config", "c", "--ca", "f", "ls"]) == "ls"
    assert command_name(["--help"]) is None and command_name([]) is None and command_name(["--url"]) is None
    assert command_name(["--bogus", "ls"]) is None
    assert modules_for(["ls"]) == ["jobs"] and modules_for(["token", "ls"]) == ["deploy"]
    assert modules_for(["--help"]) == modules_for(["lss"]) == modules_for(["cli-reference"]) == list(COMMANDS)
    assert modules_for(["ls"], completing=True) == list(COMMANDS)


def test_the_root_options_that_take_a_value_are_the_roots() -> None:
    from tidal.cli.main import ROOT_OPTIONS_WITH_VALUE
    from tidal.cli.root import app

    root = typer.main.get_command(app)
    assert {o for p in root.params if not p.is_flag for o in p.opts} == ROOT_OPTIONS_WITH_VALUE
