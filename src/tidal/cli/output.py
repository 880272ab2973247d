"""How the CLI shows results and errors: no tracebacks for errors a user can act on.

Colour only on a terminal, and not there either with ``NO_COLOR`` set (rich reads both). Off a terminal, text is
never wrapped at some assumed width: a pipe gets each line whole.

:data:`console` and :data:`err_console` are rich's consoles, made (and rich imported) when first used: a command
that prints nothing through them, as ``tidal ls`` into a pipe, does without rich."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

from tidal.errors import TidalError

if TYPE_CHECKING:
    from rich.console import Console


class _Deferred:
    """A rich Console of stdout or stderr, made on first use; each attribute is the console's."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            self._console = Console(stderr=self._stderr, soft_wrap=not stream.isatty())
        return getattr(self._console, name)


console = cast("Console", _Deferred(stderr=False))
err_console = cast("Console", _Deferred(stderr=True))


def plain_output(stream: TextIO | None = None) -> bool:
    """Whether rich would see no terminal in ``stream`` (stdout by default), told without importing it: not a
    terminal, and neither TTY_COMPATIBLE=1 nor FORCE_COLOR saying otherwise (rich's own test, which it makes
    when this says False)."""
    env = os.environ
    forced = env.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        return forced == "0"
    if env.get("FORCE_COLOR") is not None:
        return env["FORCE_COLOR"] == ""
    try:
        return not (stream or sys.stdout).isatty()
    except ValueError:  # closed
        return True


def fail(exc: TidalError, code: int = 1) -> NoReturn:
    from rich.text import Text

    # The message and hint as they are: not read as markup or emoji codes (a fingerprint's ":AB:" is not 🆎,
    # an OpenSSL "[SSL: ...]" is not a style).
    err_console.print(Text.assemble(("error:", "bold red"), " ", exc.message), highlight=False)
    if exc.hint:
        err_console.print(Text.assemble(("hint:", "yellow"), " ", exc.hint), highlight=False)
    sys.exit(code)
