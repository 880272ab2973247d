"""What a Python program imports: the modules in ``sys.modules`` as it exits, for the tests and the benchmark of
the CLI's start-up (``python -X importtime`` would leave out a module imported by ``importlib.import_module``,
as the CLI imports its command modules)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tidal.errors import TidalError

# Run as `python -c`: lists sys.modules into the file named first when the interpreter exits, after running the
# module named next (as `python -m MODULE ARGS` runs it), if any.
_LIST = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sys.modules)))
if len(sys.argv) > 1:
    del sys.argv[0]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


class UnexpectedExit(TidalError):
    """The process whose imports were asked for ended otherwise than expected."""


def imports_of(module: str | None, *args: str, env: Mapping[str, str] | None = None, expect: int | None = 0,
               timeout: float = 120) -> set[str]:
    """The modules ``python -m MODULE ARGS`` has imported when it exits (``module`` None: those the interpreter
    imports to start). ``env``: its environment (default this one's). Its output is not kept; it must exit with
    ``expect`` (None: any status), or :class:`UnexpectedExit` says how it ended."""
    with tempfile.TemporaryDirectory(prefix="tidal-imports-") as tmp:
        out = Path(tmp) / "modules"
        argv = [sys.executable, "-c", _LIST, str(out), *([module, *args] if module is not None else [])]
        p = subprocess.run(argv, env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout, check=False)
        if expect is not None and p.returncode != expect:
            raise UnexpectedExit(f"{module} {' '.join(args)} exited {p.returncode}, not {expect}: {p.stderr[-2000:]}")
        return set(out.read_text().split())
