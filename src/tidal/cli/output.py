"""How the CLI shows results and errors: no tracebacks for errors a user can act on."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console
from rich.text import Text

from tidal.errors import TidalError

console = Console()
err_console = Console(stderr=True)


def fail(exc: TidalError, code: int = 1) -> NoReturn:
    # The message and hint as they are: not read as markup or emoji codes (a fingerprint's ":AB:" is not 🆎,
    # an OpenSSL "[SSL: ...]" is not a style).
    err_console.print(Text.assemble(("error:", "bold red"), " ", exc.message), highlight=False)
    if exc.hint:
        err_console.print(Text.assemble(("hint:", "yellow"), " ", exc.hint), highlight=False)
    sys.exit(code)
