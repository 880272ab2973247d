"""Checkpoint store commands: ``tidal store usage``."""

from __future__ import annotations

import typer

from tidal.cli import listings
from tidal.cli.api import Api
from tidal.cli.formats import Format, emit, output_option, print_table

store_app = typer.Typer(help="The checkpoint store: what your checkpoints take.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(store_app, name="store")


@store_app.command("usage")
def usage(all_users: bool = typer.Option(False, "--all", help="every user's (admin)"),
          output: Format = output_option()) -> None:
    """Show the bytes of the checkpoints kept, per user and per job, and each user's store quota."""
    data = Api().get("/v1/store/usage", params={"all": all_users})

    def table(wide: bool) -> None:
        print_table(data["users"], listings.STORE_USERS.columns, wide)
        print()
        print_table(data["jobs"], listings.STORE_JOBS.columns, wide)

    emit(data, output, table)
