"""``-o table|wide|json|yaml``: how every listing and show command prints what the API answered.

``json`` and ``yaml`` print the API's objects as they are: raw numbers (seconds, bytes, Unix times) under the
field names each :class:`Listing` documents (docs/cli.md lists them; a test holds them to the API's).
``table`` and ``wide`` (``table`` and more columns) are for people, in human units (:mod:`tidal.cli.units`):

- on a terminal, a table that fits its width: a long cell wraps onto more lines, nothing is cut off;
  colours unless ``NO_COLOR`` is set;
- anywhere else (a pipe, a file), plain text: a header line, then one line per row whatever its length,
  columns padded with spaces and separated by at least two, no colour, no box. ``grep`` sees whole rows;
  a script should rather read ``-o json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import typer

from tidal.cli.output import console, plain_output


class Format(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


def output_option() -> Any:
    """The ``-o/--output`` option of a listing or show command."""
    return typer.Option(Format.table, "-o", "--output", case_sensitive=False,
                        help="table (default), wide (more columns), json or yaml (raw numbers; fields in docs/cli.md)")


Row = Mapping[str, Any]


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Row], str]
    wide: bool = False  # shown by -o wide only
    style: Callable[[Row], str | None] = lambda _: None  # its colour on a terminal


@dataclass(frozen=True)
class Listing:
    """What a command lists: the JSON fields of each item (name → meaning, documented in docs/cli.md) and its
    table's columns."""

    command: str
    fields: Mapping[str, str]
    columns: Sequence[Column] = ()
    note: str = ""


def dump(data: Any, fmt: Format) -> None:
    """``data`` as JSON or YAML on stdout, raw."""
    if fmt is Format.json:
        print(json.dumps(data, indent=1))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")


def emit(data: Any, fmt: Format, table: Callable[[bool], None]) -> None:
    """``data`` in ``fmt``: dumped for json/yaml, else ``table(wide)`` renders it for people."""
    if fmt in (Format.json, Format.yaml):
        dump(data, fmt)
    else:
        table(fmt is Format.wide)


def print_rows(rows: Iterable[Row], listing: Listing, fmt: Format, title: str | None = None) -> None:
    rows = list(rows)
    emit(rows, fmt, lambda wide: print_table(rows, listing.columns, wide, title))


def print_table(rows: Sequence[Row], columns: Sequence[Column], wide: bool = False, title: str | None = None) -> None:
    cols = [c for c in columns if wide or not c.wide]
    cells = [[_one_line(c.value(r)) for c in cols] for r in rows]
    if not plain_output() and console.is_terminal:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        t = Table(*(c.header for c in cols), box=box.SIMPLE_HEAD, title=title, title_justify="left",
                  header_style="bold", pad_edge=False)
        for col in t.columns:
            col.overflow = "fold"
        for r, line in zip(rows, cells, strict=True):
            t.add_row(*(Text(v, style=c.style(r) or "") for c, v in zip(cols, line, strict=True)))
        console.print(t)
        return
    if title:
        print(title)
    print(plain([[c.header for c in cols], *cells]))


def plain(lines: Sequence[Sequence[str]]) -> str:
    """Rows as plain text: each column as wide as its widest cell, two spaces between, no trailing blanks."""
    if not lines:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _one_line(value: str) -> str:
    return " ".join(value.split()) if any(ch in value for ch in "\n\r\t") else value

