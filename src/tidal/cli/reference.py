"""docs/cli.md, generated from the parser: every command, argument and flag of ``tidal`` with its help, and the
fields of every listing's JSON (:mod:`tidal.cli.listings`). ``tidal cli-reference`` (hidden) prints it;
``make docs`` writes it; a test checks that the file is current."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from typer._click.core import Context  # Typer parses with its own copy of click (pinned by requirements.lock)
from typer.core import TyperGroup

from tidal.cli.listings import LISTINGS

HEADER = """\
# The `tidal` command line

Every command and flag, generated from the parser (`make docs`, i.e. `tidal cli-reference > docs/cli.md`;
a test fails when this file is not current). Only what is printed by the commands themselves is described
here; the cluster they talk to is in [cluster.md](cluster.md).

## Where the control plane is

Each setting comes from the first of: a flag of `tidal` itself (before the command), the environment, the
config file, and, for the URL and token, the local cluster that `tidal up` started.

| config key | flag | environment | meaning |
|---|---|---|---|
| `url` | `--url URL` | `TIDAL_URL` | the control plane's URL |
| `token` | `--token-file FILE` | `TIDAL_TOKEN` | your API token (never on the command line: others may read it there) |
| `ca` | `--ca FILE` | `TIDAL_CA` | trust the control plane through this CA certificate (PEM) |
| `ca_fingerprint` | `--ca-fingerprint SHA256` | `TIDAL_CA_FINGERPRINT` | or pin its CA's SHA-256 fingerprint |

The config file is `$XDG_CONFIG_HOME/tidal/config` (`~/.config/tidal/config`), or the one `--config FILE` or
`TIDAL_CONFIG` names. One `key = "value"` a line (TOML's form; the quotes may be left out), `#` comments:

```
url = "https://tidal.example:8470"
token = "tdl_..."
ca_fingerprint = "AB:CD:..."
```

A config file that holds a token must be readable by you alone: `tidal` refuses it otherwise (`chmod 600`).

## Output

Every listing and show command takes `-o table|wide|json|yaml`:

- `table` (the default) and `wide` (more columns) are for people: human units (`1.08 s`, `4.0 GiB`,
  `3m 12s ago`). On a terminal the table fits its width (a long cell wraps, nothing is cut off), in colour
  unless `NO_COLOR` is set. Piped or redirected, it is plain text: a header line, then one line per row
  however long, columns padded with spaces (at least two between them), no colour, so `grep` sees whole rows.
- `json` and `yaml` are for scripts: the API's objects with raw numbers (seconds, bytes, Unix times), under
  the field names listed below each command. These names are stable: new fields may appear, the ones
  listed keep their names and meanings (a test holds this list to what the API answers).

Exit status: 0 on success; 1 for an error (its message and a hint on stderr); 2 for a usage error found
before anything was sent. `tidal wait JOB` and `tidal logs -f JOB` exit with the job's exit status: 0 when it
succeeded; when it failed, the exit code of the rank that failed first (1 when it has none, e.g. it was
killed by a signal from outside Tidal after its last restart); 130 when it was cancelled.

## Commands
"""


def commands(group: Any, ctx: Any, prefix: str = "tidal") -> Iterator[tuple[str, Any]]:
    """Every visible command under ``group``, depth first, in the order `--help` lists them."""
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        path = f"{prefix} {name}"
        yield path, cmd
        if isinstance(cmd, TyperGroup):
            yield from commands(cmd, Context(cmd, parent=ctx, info_name=name), path)


def _is_option(p: Any) -> bool:
    return any(o.startswith("-") for o in p.opts)


def _kind(p: Any) -> str:
    """What a parameter takes: its metavar, its choices (``a|b``), or its type's name."""
    if p.metavar:
        return str(p.metavar)
    t = p.type_descriptor.annotation
    args = getattr(t, "__args__", None)
    if args:
        t = args[0]
    if isinstance(t, type) and issubclass(t, Enum):
        return "|".join(str(m.value) for m in t)
    return {int: "INT", float: "SECONDS" if p.name in ("timeout",) else "FLOAT", str: "TEXT",
            Path: "PATH"}.get(t, "VALUE")


def _default(p: Any) -> str:
    d = p.default
    if d is None or d is False or d == () or d == [] or callable(d) or getattr(p, "is_flag", False):
        return ""
    return f"`{d.value if isinstance(d, Enum) else d}`"


def _flags(p: Any) -> str:
    metavar = "" if p.is_flag else " " + _kind(p)
    return ", ".join(f"`{o}{metavar}`" for o in [*p.opts, *p.secondary_opts]).replace("|", "\\|")


def _argument(p: Any) -> str:
    name = str(p.metavar or p.name.upper())
    return name + ("..." if p.nargs == -1 else "")


def _usage(path: str, cmd: Any) -> str:
    parts = [path]
    if any(_is_option(p) for p in cmd.params):
        parts.append("[OPTIONS]")
    for p in cmd.params:
        if not _is_option(p):
            arg = _argument(p)
            parts.append(arg if p.required or arg.startswith("[") else f"[{arg}]")
    if isinstance(cmd, TyperGroup):
        parts.append("COMMAND [ARGS]...")
    return " ".join(parts)


def _help(cmd: Any) -> str:
    return inspect.cleandoc(cmd.help or "").strip()


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def section(path: str, cmd: Any) -> str:
    lines = [f"### `{path}`", "", f"`{_usage(path, cmd)}`", ""]
    if cmd.help:
        lines += [_help(cmd), ""]
    params = [p for p in cmd.params if not p.hidden and p.name != "help"]
    if params:
        lines += ["| argument or flag | meaning | default |", "|---|---|---|"]
        for p in params:
            if _is_option(p):
                lines.append(f"| {_flags(p)} | {_one_line(p.help)} | {_default(p)} |")
            else:
                kind = "" if p.metavar else _kind(p)
                meaning = _one_line(p.help) + (f" ({kind})".replace("|", ", ") if "|" in kind else "")
                name = _argument(p).replace("|", "\\|")
                lines.append(f"| `{name}` | {meaning.strip()} | {_default(p)} |")
        lines.append("")
    name = path.removeprefix("tidal").strip()
    listing = LISTINGS.get(name)
    if listing is not None:
        lines += _fields(listing.command, listing.fields, listing.note)
    for extra in sorted(k for k in LISTINGS if name and k.startswith(name + ": ")):
        lines += _fields(extra, LISTINGS[extra].fields, LISTINGS[extra].note)
    return "\n".join(lines)


def _fields(name: str, fields: Mapping[str, str], note: str) -> list[str]:
    out = [f"Fields of `{name}` (`-o json|yaml`){': ' + note if note else ''}", "", "| field | meaning |",
           "|---|---|"]
    out += [f"| `{k}` | {_one_line(v)} |" for k, v in fields.items()]
    return [*out, ""]


def markdown(app: typer.Typer) -> str:
    root = typer.main.get_command(app)
    ctx = Context(root, info_name="tidal")
    parts = [HEADER, section("tidal", root)]
    parts += [section(path, cmd) for path, cmd in commands(root, ctx)]
    return "\n".join(parts).rstrip() + "\n"


def register(app: typer.Typer) -> None:
    @app.command("cli-reference", hidden=True)
    def cli_reference() -> None:
        """Print docs/cli.md: every command and flag, from the parser."""
        print(markdown(app), end="")
