"""``tidal doctor``: is this machine ready to run Tidal, and what to do where it is not.

The checks are those of the layers they check: the machine's (kernel, root, CRIU, cgroups, torch, staging)
in :mod:`tidal.mechanisms.checks`, the GPUs an agent would offer (NVML, the NVIDIA and CUDA drivers, the CUDA
checkpoint API, NCCL) in :mod:`tidal.agent.gpuchecks`, the control plane's (TIDAL_HOME, PostgreSQL) in
:mod:`tidal.control.checks`. This command only runs them and renders them: a table, or ``-o json|yaml``. The exit
code is 1 when a *required* check is missing; warnings never fail.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer

from tidal.cli import listings
from tidal.cli.formats import Format, emit, output_option, print_table
from tidal.cli.output import console

if TYPE_CHECKING:
    from tidal.mechanisms.checks import Check

# The checks are imported where they run: `tidal --help` imports this module, and needs none of them.


def run_checks() -> list[Check]:
    """Every check, in display order: the machine's, its GPUs', then the control plane's."""
    from tidal.agent import gpuchecks
    from tidal.control.checks import control_plane_checks
    from tidal.mechanisms import checks

    return checks.run_checks([*checks.machine_checks(), *gpuchecks.planned(), *control_plane_checks()])


def exit_code(results: Sequence[Check]) -> int:
    return 1 if any(c.failed for c in results) else 0


def to_json(results: Sequence[Check]) -> dict[str, Any]:
    return {"ok": exit_code(results) == 0, "checks": [asdict(c) for c in results]}


def render(results: Sequence[Check], wide: bool = False) -> None:
    from rich.text import Text

    rows = [asdict(c) for c in results]
    print_table(rows, listings.CHECKS.columns, wide, title="tidal doctor")
    failed = [c.name for c in results if c.failed]
    warns = sum(c.status == "warn" for c in results)
    if failed:
        console.print(Text.assemble((f"{len(failed)} required check(s) missing:", "bold red"), " " + ", ".join(failed)))
    else:
        console.print(Text.assemble(("Ready:", "green"),
                                    f" every required check passes; {warns} optional item(s) missing."))


def doctor(
    output: Format = output_option(),
    as_json: bool = typer.Option(False, "--json", help="as -o json"),
    slurm: bool = typer.Option(False, "--slurm",
                               help="check the Slurm site for `tidal run` instead: Slurm's version, PreemptMode, "
                                    "GraceTime, signals, the checkpoint store, CRIU on every node (through srun)"),
    store: str = typer.Option(None, "--store", metavar="URL",
                              help="with --slurm: the checkpoint store to check (over TIDAL_CHECKPOINT_STORE)"),
) -> None:
    """Check this machine: kernel, root, CRIU and its features, cgroups, torch, PostgreSQL, GPUs."""
    if slurm:
        from tidal.mechanisms import checks
        from tidal.mechanisms.slurm import site

        results = checks.run_checks(site.slurm_checks(store or os.environ.get("TIDAL_CHECKPOINT_STORE")))
    else:
        results = run_checks()
    emit(to_json(results), Format.json if as_json else output, lambda wide: render(results, wide))
    raise typer.Exit(exit_code(results))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    if app.registered_callback is None:
        # Without a callback, a Typer app with a single command runs it as the root command, and
        # `tidal doctor` would be rejected; a no-op callback keeps `tidal` a group of sub-commands.
        app.callback()(_group)


def _group() -> None:
    pass
