"""The import contracts in pyproject.toml (``[tool.importlinter]``): they hold for the package, and each one
catches the imports it forbids, directly or through a chain, when they are written into a copy of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# An import written at the end of a module of a copy of the package, and what each contract must then say:
# "A is not allowed to import B", and the first link of the chain.
VIOLATIONS = {
    "cli/main.py": "import tidal.mechanisms.criu.job",
    "cli/cluster.py": "import tidal.control.store.db",
    "core/spec.py": "import tidal.control.tokens",
    "sim/cost.py": "import tidal.mechanisms.storage",
    "agent/fencing.py": "import tidal.control.history",
    "policy/quota.py": "import tidal.config",
    "mechanisms/permissions.py": "import tidal.policy.quota",
    "control/client.py": "import tidal.control.jobs",
    "control/reconcile.py": "import tidal.testing.control",
}
CAUGHT: dict[str, list[tuple[str, str]]] = {
    "layers": [
        ("tidal.core is not allowed to import tidal.control", "tidal.core.spec -> tidal.control.tokens"),
        ("tidal.sim is not allowed to import tidal.mechanisms", "tidal.sim.cost -> tidal.mechanisms.storage"),
        ("tidal.agent is not allowed to import tidal.control", "tidal.agent.fencing -> tidal.control.history"),
    ],
    "pure-core": [
        ("tidal.policy is not allowed to import tidal.config", "tidal.policy.quota -> tidal.config"),
        ("tidal.core is not allowed to import tidal.control", "tidal.core.spec -> tidal.control.tokens"),
    ],
    "ranks-not-scheduling": [
        ("tidal.mechanisms is not allowed to import tidal.policy",
         "tidal.mechanisms.permissions -> tidal.policy.quota"),
    ],
    "cli-through-client": [
        ("tidal.cli is not allowed to import tidal.mechanisms", "tidal.cli.main -> tidal.mechanisms.criu.job"),
        ("tidal.cli is not allowed to import tidal.control", "tidal.cli.cluster -> tidal.control.store.db"),
        # indirect: through the core, which the CLI may import
        ("tidal.cli is not allowed to import tidal.control", "tidal.cli.jobenv -> tidal.core.spec"),
    ],
    "testing-is-for-tests": [
        ("tidal.control is not allowed to import tidal.testing", "tidal.control.reconcile -> tidal.testing.control"),
    ],
    "client-speaks-http": [
        ("tidal.control.client is not allowed to import tidal.control.jobs",
         "tidal.control.client -> tidal.control.jobs"),
        ("tidal.control.client is not allowed to import tidal.control.store",
         "tidal.control.client -> tidal.control.jobs"),
    ],
}


def _lint_imports(src: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts over the package under ``src``."""
    argv = [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(CONFIG)]
    for c in contracts:
        argv += ["--contract", c]
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "200"}
    return subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, timeout=120, check=False)


def _contract_ids() -> set[str]:
    config = tomllib.loads(CONFIG.read_text())
    return {c["id"] for c in config["tool"]["importlinter"]["contracts"]}


def test_the_contracts_hold() -> None:
    out = _lint_imports(ROOT / "src")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(_contract_ids())} kept, 0 broken." in out.stdout


def test_every_contract_is_tried_on_a_violation() -> None:
    assert _contract_ids() == set(CAUGHT)


@pytest.fixture(scope="module")
def broken_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("broken") / "src"
    shutil.copytree(ROOT / "src" / "tidal", src / "tidal", ignore=shutil.ignore_patterns("__pycache__"))
    for module, line in VIOLATIONS.items():
        with open(src / "tidal" / module, "a") as f:
            f.write(f"\n{line}  # a violation written by {__name__}\n")
    return src


@pytest.mark.parametrize("contract", sorted(CAUGHT))
def test_the_contract_catches_its_violations(broken_copy: Path, contract: str) -> None:
    out = _lint_imports(broken_copy, contract)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "0 kept, 1 broken" in text, text
    for rule, link in CAUGHT[contract]:
        assert f"{rule}:" in text, text
        assert link in text, text
