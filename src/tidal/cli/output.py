"""How the CLI shows results and errors: no tracebacks for errors a user can act on."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console

from tidal.errors import TidalError

console = Console()
err_console = Console(stderr=True)


def fail(exc: TidalError, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {exc.message}", highlight=False)
    if exc.hint:
        err_console.print(f"[yellow]hint:[/] {exc.hint}", highlight=False)
    sys.exit(code)
