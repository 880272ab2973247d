"""docs/cli.md is generated from the parser: it must be current, and it must list every command and flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tidal.cli.listings import LISTINGS

DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def test_docs_cli_md_is_current() -> None:
    p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "cli-reference"], capture_output=True, text=True,
                       timeout=60, check=True)
    assert p.stdout == DOC.read_text(), "docs/cli.md is out of date: run `make docs`"


def test_it_lists_every_command_flag_and_listing() -> None:
    text = DOC.read_text()
    for heading in ("`tidal ls`", "`tidal logs`", "`tidal token ls`", "`tidal completion`", "`tidal`"):
        assert f"### {heading}\n" in text
    for flag in ("`-o table\\|wide\\|json\\|yaml`", "`--follow`", "`--rank INT`", "`--version`", "`--config FILE`",
                 "`--ca-fingerprint SHA256`"):
        assert flag in text, flag
    for name in LISTINGS:
        assert f"Fields of `{name}`" in text, name
    assert "cli-reference" not in text.split("## Commands")[1]  # hidden
