"""``tidal`` itself: the root of the command line, its options (where the control plane is, ``--version``)
and its help. The commands are added to :data:`app` by their modules (:mod:`tidal.cli.main` says which)."""

from __future__ import annotations

from pathlib import Path

import typer

from tidal.cli import coercion
from tidal.cli.config import connection, token_from_file
from tidal.cli.version import tidal_version

coercion.install()  # the options' values converted without pydantic where Typer's adapter only wraps a function

app = typer.Typer(
    name="tidal",
    help="Tidal: preemptible, migratable, elastically resizable deep-learning jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text as written: `[rank N]` is text, not a style
)


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
