"""``tidal doctor``: is this machine ready to run Tidal, and what to do where it is not.

The checks are those of the layers they check: the machine's (kernel, root, CRIU, cgroups, torch, GPUs,
staging) in :mod:`tidal.mechanisms.checks`, the control plane's (TIDAL_HOME, PostgreSQL) in
:mod:`tidal.control.checks`. This command only runs them and renders them: a table, or ``--json``. The exit
code is 1 when a *required* check is missing; warnings never fail.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import typer
from rich.table import Table

from tidal.cli.output import console
from tidal.control.checks import control_plane_checks
from tidal.mechanisms import checks
from tidal.mechanisms.checks import Check


def run_checks() -> list[Check]:
    """Every check, in display order: the machine's, then the control plane's."""
    return checks.run_checks([*checks.machine_checks(), *control_plane_checks()])


def exit_code(results: Sequence[Check]) -> int:
    return 1 if any(c.failed for c in results) else 0


def to_json(results: Sequence[Check]) -> dict[str, Any]:
    return {"ok": exit_code(results) == 0, "checks": [asdict(c) for c in results]}


_STYLE = {"ok": "[green]OK[/]", "warn": "[yellow]warn[/]", "missing": "[bold red]MISSING[/]"}


def render(results: Sequence[Check]) -> None:
    table = Table(title="tidal doctor", title_justify="left", expand=True)
    table.add_column("requirement", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=3)
    table.add_column("how to fix", overflow="fold", ratio=2)
    for c in results:
        label = c.name if c.required else f"{c.name} [dim]opt.[/]"
        table.add_row(label, _STYLE[c.status], c.detail, c.fix)
    console.print(table, highlight=False)
    failed = [c.name for c in results if c.failed]
    warns = sum(c.status == "warn" for c in results)
    if failed:
        console.print(f"[bold red]{len(failed)} required check(s) missing:[/] {', '.join(failed)}",
                      highlight=False)
    else:
        console.print(f"[green]Ready:[/] every required check passes; {warns} optional item(s) missing.",
                      highlight=False)


def doctor(
    as_json: bool = typer.Option(False, "--json", help="print the checks as JSON"),
) -> None:
    """Check this machine: kernel, root, CRIU and its features, cgroups, torch, PostgreSQL, GPUs."""
    results = run_checks()
    if as_json:
        typer.echo(json.dumps(to_json(results), indent=2))
    else:
        render(results)
    raise typer.Exit(exit_code(results))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    if app.registered_callback is None:
        # Without a callback, a Typer app with a single command runs it as the root command, and
        # `tidal doctor` would be rejected; a no-op callback keeps `tidal` a group of sub-commands.
        app.callback()(_group)


def _group() -> None:
    pass
