"""The ``tidal`` command line. Thin: each command lives in its own module and registers itself here."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import typer

from tidal.cli import completion
from tidal.cli.config import connection, token_from_file
from tidal.cli.output import fail
from tidal.errors import TidalError

app = typer.Typer(
    name="tidal",
    help="Tidal: preemptible, migratable, elastically resizable deep-learning jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text as written: `[rank N]` is text, not a style
)


def tidal_version() -> str:
    try:
        return version("tidal")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        print(f"tidal {tidal_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    url: str = typer.Option(None, "--url", metavar="URL",
                            help="the control plane's URL (over TIDAL_URL and the config file's url)"),
    token_file: Path = typer.Option(None, "--token-file", metavar="FILE",
                                    help="a file holding your API token (over TIDAL_TOKEN and the config file's "
                                         "token)"),
    ca: Path = typer.Option(None, "--ca", metavar="FILE",
                            help="trust the control plane through this CA certificate (over TIDAL_CA and the "
                                 "config file's ca)"),
    ca_fingerprint: str = typer.Option(None, "--ca-fingerprint", metavar="SHA256",
                                       help="or pin its CA's fingerprint (over TIDAL_CA_FINGERPRINT and the config "
                                            "file's ca_fingerprint)"),
    config: Path = typer.Option(None, "--config", metavar="FILE",
                                help="the config file (over TIDAL_CONFIG; default ~/.config/tidal/config)"),
    _version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                  help="print tidal's version and exit"),
) -> None:
    """Tidal: preemptible, migratable, elastically resizable deep-learning jobs.

    Where the control plane is: flags, then TIDAL_URL, TIDAL_TOKEN, TIDAL_CA, TIDAL_CA_FINGERPRINT, then the
    config file (url, token, ca, ca_fingerprint), then the local cluster of `tidal up`."""
    connection.config = config
    flags = {"url": url, "ca": ca and str(ca.absolute()), "ca_fingerprint": ca_fingerprint,
             "token": token_file and token_from_file(token_file)}
    connection.flags = {k: v for k, v in flags.items() if v}


def _register() -> None:
    # Each module adds its commands to `app`; imported here so `tidal --help` lists them all.
    from tidal.cli import cluster, demo, deploy, doctor, jobs, logs, reference, run, sim, store, users

    for module in (cluster, deploy, jobs, logs, store, users, run, demo, sim, doctor, completion, reference):
        module.register(app)


def main() -> None:
    _register()
    try:
        # Named `tidal` however it was started (`python -m tidal.cli.main` too): in its usage lines, and in the
        # variable the shell completion scripts set.
        app(prog_name=completion.PROG, complete_var=completion.COMPLETE_VAR)
    except TidalError as exc:
        fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
