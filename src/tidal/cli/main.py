"""The ``tidal`` command line. Thin: each command lives in its own module and registers itself here."""

from __future__ import annotations

import sys

import typer

from tidal.cli.output import fail
from tidal.errors import TidalError

app = typer.Typer(
    name="tidal",
    help="Tidal: preemptible, migratable, elastically resizable deep-learning jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Tidal: preemptible, migratable, elastically resizable deep-learning jobs."""


def _register() -> None:
    # Each module adds its commands to `app`; imported here so `tidal --help` lists them all.
    from tidal.cli import cluster, demo, deploy, doctor, jobs, sim

    for module in (cluster, deploy, jobs, demo, sim, doctor):
        module.register(app)


def main() -> None:
    _register()
    try:
        app()
    except TidalError as exc:
        fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
