"""How the CLI shows results and errors: no tracebacks for errors a user can act on.

Colour only on a terminal, and not there either with ``NO_COLOR`` set (rich reads both). Off a terminal, text is
never wrapped at some assumed width: a pipe gets each line whole."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console
from rich.text import Text

from tidal.errors import TidalError

console = Console(soft_wrap=not sys.stdout.isatty())
err_console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def fail(exc: TidalError, code: int = 1) -> NoReturn:
    # The message and hint as they are: not read as markup or emoji codes (a fingerprint's ":AB:" is not 🆎,
    # an OpenSSL "[SSL: ...]" is not a style).
    err_console.print(Text.assemble(("error:", "bold red"), " ", exc.message), highlight=False)
    if exc.hint:
        err_console.print(Text.assemble(("hint:", "yellow"), " ", exc.hint), highlight=False)
    sys.exit(code)
