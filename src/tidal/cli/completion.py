"""``tidal completion bash|zsh|fish``: the shell's completion script for ``tidal`` (commands, flags, and the
values of flags with fixed choices), printed for the user to install:

    tidal completion bash > ~/.local/share/bash-completion/completions/tidal
    tidal completion zsh > "${fpath[1]}/_tidal"
    tidal completion fish > ~/.config/fish/completions/tidal.fish

The script asks ``tidal`` itself for the candidates (``_TIDAL_COMPLETE=complete_SHELL tidal ...``), which Typer
answers. The scripts are Typer's (its completion module, pinned by requirements.lock)."""

from __future__ import annotations

import os
from enum import StrEnum

import typer

PROG = "tidal"
COMPLETE_VAR = "_TIDAL_COMPLETE"


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def _init() -> None:
    from typer._completion_classes import completion_init

    completion_init()


def script(shell: Shell) -> str:
    from typer._completion_shared import get_completion_script

    _init()
    return get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell.value)


def register(app: typer.Typer) -> None:
    if os.environ.get(COMPLETE_VAR):  # the shell asks for candidates: Typer answers, with these shells known
        _init()

    @app.command()
    def completion(shell: Shell = typer.Argument(..., help="bash, zsh or fish")) -> None:
        """Print the shell completion script for tidal (e.g. `tidal completion bash >
        ~/.local/share/bash-completion/completions/tidal`)."""
        print(script(shell))
