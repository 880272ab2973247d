"""The ``tidal`` command line. Thin: each command lives in its own module and registers itself on the root
(:mod:`tidal.cli.root`) with ``register(app)``.

It starts with what the command run needs, and no more: ``tidal --version`` imports nothing of the CLI,
``tidal ls`` the root and the module of ``ls`` alone (with what that module imports), so that a short command
is not kept waiting on the imports of all the others. ``tidal --help``, shell completion, ``tidal
cli-reference`` and anything not recognised below register every module: what they list is complete."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import import_module

# The command modules (tidal/cli/MODULE.py), in the order `tidal --help` lists their commands, each with the
# names of the commands and command groups its `register(app)` adds: `tidal NAME ...` imports NAME's module.
#
# To add a module: write tidal/cli/MODULE.py with a `register(app: typer.Typer) -> None` as the others have
# (`@app.command()` functions, or `app.add_typer(group, name=...)`), and add its one line here, e.g.
#     "users": ("user",),
# A command or group added to a module that is already here: its name on the module's line. A module or a
# name left out still works (as a word not recognised, it registers every module), only slower;
# tests/unit/cli/test_startup.py fails, saying what to add, until this table says what the modules register.
COMMANDS: dict[str, tuple[str, ...]] = {
    "cluster": ("up", "status", "down", "nodes"),
    "deploy": ("server", "agent", "token", "node"),
    "jobs": ("resize", "submit", "ls", "show", "wait", "cancel", "checkpoints", "events", "preempt", "resume",
             "migrate"),
    "logs": ("logs",),
    "store": ("store",),
    "users": ("user", "project", "whoami"),
    "run": ("run",),
    "demo": ("demo",),
    "sim": ("sim",),
    "doctor": ("doctor",),
    "completion": ("completion",),
    "reference": ("cli-reference",),
}
# Commands that read every other command: they need them all registered.
NEEDS_ALL = frozenset({"cli-reference"})
# tidal's own options that take a value (the root's, tidal.cli.root), skipped to find the command's name.
ROOT_OPTIONS_WITH_VALUE = frozenset({"--url", "--token-file", "--ca", "--ca-fingerprint", "--config"})


def command_name(args: Sequence[str]) -> str | None:
    """The command ``tidal ARGS`` runs: the first word after tidal's own options; None where there is none or
    where something else comes first (``--help``, ``--version``, an option tidal does not have)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ROOT_OPTIONS_WITH_VALUE:
            i += 2
        elif arg.startswith("--") and arg.partition("=")[0] in ROOT_OPTIONS_WITH_VALUE:
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return arg
    return None


def modules_for(args: Sequence[str], completing: bool = False) -> list[str]:
    """The command modules ``tidal ARGS`` registers: its command's, or every one (``completing``: the shell
    asks for the candidates of what the user is typing)."""
    name = command_name(args)
    if not completing and name not in NEEDS_ALL:
        for module, names in COMMANDS.items():
            if name in names:
                return [module]
    return list(COMMANDS)


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:  # answered before Typer is imported (the root's eager --version says the same)
        from tidal.cli.version import tidal_version

        print(f"tidal {tidal_version()}")
        return
    from tidal.errors import TidalError

    try:
        from tidal.cli import completion
        from tidal.cli.root import app

        for module in modules_for(args, completing=bool(os.environ.get(completion.COMPLETE_VAR))):
            import_module(f"tidal.cli.{module}").register(app)
        # Named `tidal` however it was started (`python -m tidal.cli.main` too): in its usage lines, and in the
        # variable the shell completion scripts set.
        app(prog_name=completion.PROG, complete_var=completion.COMPLETE_VAR)
    except TidalError as exc:
        from tidal.cli.output import fail

        fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
