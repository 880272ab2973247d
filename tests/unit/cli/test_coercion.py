"""The values of every option and argument of `tidal`, converted directly (tidal.cli.coercion), come out as
Typer's own conversion (pydantic's) makes them: the same value of the same type, or the same error."""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
import typer
from typer import _coercion, core
from typer._click.core import Context
from typer._typing import get_args, get_origin

from tidal.cli import coercion
from tidal.cli.main import COMMANDS

coercion.install()

SAMPLES: dict[Any, tuple[Any, ...]] = {
    str: ("x", "a b", "", "12", "é—ü", "-", "--", b"bytes"),
    int: ("0", "7", "-3", "007", "1_0", " 7", "7.0", "abc", "+5", "", "-1", "99999999999999999999", 7, 2.5),
    float: ("1.5", "2", "-0.5", "1e3", "inf", "abc", ".5", "5.", "", "0", "-1", 3),
    Path: ("/tmp/x", "rel/p", "", "-", "~/x", ".", "/nonexistent/x", Path("/tmp")),
    bool: (True, False, "true", "no", ""),
}


def _parameters() -> Iterator[tuple[str, Any, Any]]:
    """Every parameter of every command of `tidal` (the root's too), with its command's context."""
    app = typer.Typer()
    app.callback()(lambda: None)
    for module in COMMANDS:
        import_module(f"tidal.cli.{module}").register(app)
    from tidal.cli.root import app as root

    def walk(cmd: Any, ctx: Context, path: str) -> Iterator[tuple[str, Any, Any]]:
        for p in cmd.params:
            if hasattr(p, "type_descriptor"):
                yield f"{path} {p.name}", p, ctx
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, Context(sub, parent=ctx, info_name=name), f"{path} {name}")

    yield from walk(typer.main.get_command(root), Context(typer.main.get_command(root), info_name="tidal"), "tidal")
    group = typer.main.get_group(app)
    yield from walk(group, Context(group, info_name="tidal"), "tidal")


def _samples(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) is list:
        inner = _samples(get_args(annotation)[0])
        return (tuple(inner[:3]), list(inner[:2]), (), *inner[:2])
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        values = [str(m.value) for m in annotation]
        return (*values, *(v.upper() for v in values), "nope", "", next(iter(annotation)))
    return SAMPLES.get(annotation, ("x", "1", ""))


def _outcome(runtime: Any, value: Any, param: Any, ctx: Context) -> tuple[Any, ...]:
    try:
        out = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return ("error", type(exc).__name__, message)
    return ("value", out, type(out), [type(x) for x in out] if isinstance(out, list) else None)


PARAMETERS = list(_parameters())


@pytest.mark.parametrize(("name", "param", "ctx"), PARAMETERS, ids=[p[0] for p in PARAMETERS])
def test_the_direct_conversion_is_typers(name: str, param: Any, ctx: Context) -> None:
    descriptor = param.type_descriptor
    direct, typers = core.build_runtime_param(descriptor), _coercion.build_runtime_param(descriptor)
    for value in _samples(descriptor.annotation):
        assert _outcome(direct, value, param, ctx) == _outcome(typers, value, param, ctx), (name, value)


def test_the_commands_of_jobs_and_tidals_own_options_need_no_pydantic() -> None:
    direct = {name for name, p, _ in PARAMETERS
              if type(core.build_runtime_param(p.type_descriptor)).__name__ == "Direct"}
    for name in ("tidal url", "tidal config", "tidal ca", "tidal ls output", "tidal ls all_users", "tidal show job_id",
                 "tidal submit command", "tidal submit ranks", "tidal submit env", "tidal logs rank",
                 "tidal wait timeout", "tidal events last"):
        assert name in direct, name
