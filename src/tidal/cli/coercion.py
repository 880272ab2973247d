"""The values of the commands' options and arguments, converted without pydantic where it is not needed.

Typer (0.29, pinned by requirements.lock) converts each value given on the command line, and each default of
``tidal``'s own options, through a pydantic ``TypeAdapter`` it builds for the parameter: pydantic's import and
one schema a parameter are most of what a short command such as ``tidal ls`` spends before it sends its
request. Typer's adapters for the types these commands take wrap plain functions (a choice, a path) or keep
the value as it is (a string): :func:`install` has Typer convert such a value directly, with the same
functions, and asks Typer's own conversion (pydantic's) for anything else: another type, a bound, a value it
cannot tell at once (a number written otherwise than plain digits), and every error, whose message is then
Typer's own. tests/unit/cli/test_coercion.py holds the two to the same results for every parameter of
``tidal``. Should Typer's internals not be those this expects, :func:`install` leaves Typer as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any, Union, cast

_DIGITS = re.compile(r"-?[0-9]{1,30}")
_DECIMAL = re.compile(r"-?[0-9]{1,30}(\.[0-9]{1,30})?")


#: What a direct conversion returns where it cannot tell: Typer's own is asked.
_UNSURE = object()


def install() -> None:
    """Have Typer convert the parameters' values directly where it can (see the module's docstring)."""
    try:
        from typer import _coercion, core
        from typer._param_types import coerce_cli_choice, coerce_cli_path, routes_to_path
        from typer._typing import get_args, get_origin, is_literal_type
    except ImportError:  # another Typer: its own conversion, as it is
        return
    found = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if found is None or base is None or getattr(found, "tidal_direct", False):
        return
    original: Callable[[Any], Any] = found

    @dataclass(frozen=True)
    class Direct(base):  # type: ignore[misc, valid-type]
        """A parameter's value converted by ``convert``; Typer's conversion where it raises."""

        convert: Callable[[Any, Any, Any], Any]
        descriptor: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                out = self.convert(value, param, ctx)
            except Exception:  # an error is Typer's to word
                out = _UNSURE
            if out is _UNSURE:
                return original(self.descriptor)._coerce_value(value, param, ctx)
            return out

    def leaf(annotation: Any, info: Any) -> Callable[[Any, Any, Any], Any] | None:
        """How a value of ``annotation`` is converted as Typer's adapter converts it (typer._adapters'
        build_leaf_adapter, in its order); None: not directly."""
        if info.parser is not None:
            return None
        if (isinstance(annotation, type) and issubclass(annotation, Enum)) or is_literal_type(annotation):
            choices = tuple(cast("type[Enum]", annotation)) if isinstance(annotation, type) else get_args(annotation)
            return lambda v, _p, ctx: coerce_cli_choice(v, choices=choices, case_sensitive=info.case_sensitive,
                                                        ctx=ctx)
        if annotation is int or annotation is float:
            if info.clamp:
                return None
            pattern = _DIGITS if annotation is int else _DECIMAL

            def number(v: Any, _p: Any, _ctx: Any) -> Any:
                if type(v) is annotation:  # a default written as a number
                    n = v
                elif not isinstance(v, str) or not pattern.fullmatch(v):
                    return _UNSURE
                else:
                    n = annotation(v)
                if (info.min is not None and n < info.min) or (info.max is not None and n > info.max):
                    return _UNSURE  # out of bounds: Typer says so
                return n

            return number
        if annotation is bool:
            def flag(v: Any, _p: Any, _ctx: Any) -> Any:
                if type(v) is not bool:
                    return _UNSURE  # a word for a boolean: Typer reads it
                return v

            return flag
        if annotation is str:
            def text(v: Any, _p: Any, _ctx: Any) -> Any:
                if type(v) is not str:
                    return _UNSURE
                return v

            return text
        if annotation is Path and info.path_type is None and routes_to_path(annotation, info):
            def path(v: Any, p: Any, ctx: Any) -> Any:
                if type(v) is not str or not v:
                    return _UNSURE
                return coerce_cli_path(Path(v), info, path_type=Path, param=p, ctx=ctx)

            return path
        return None

    def build(descriptor: Any) -> Any:
        annotation, info = descriptor.annotation, descriptor.parameter_info
        convert: Callable[[Any, Any, Any], Any] | None = None
        if descriptor.file_annotation is None:
            if get_origin(annotation) in (Union, UnionType) and len(get_args(annotation)) == 2 and (
                    type(None) in get_args(annotation)):
                # ``X | None``: as X, and None as it is (an option left out)
                inner = next(a for a in get_args(annotation) if a is not type(None))
                built = build(replace(descriptor, annotation=inner))
                if isinstance(built, Direct):
                    def maybe(v: Any, p: Any, ctx: Any, of: Callable[[Any, Any, Any], Any] = built.convert) -> Any:
                        return None if v is None else of(v, p, ctx)

                    convert = maybe
            elif get_origin(annotation) is list and len(get_args(annotation)) == 1:
                item = leaf(get_args(annotation)[0], info)
                if item is not None:
                    def items(v: Any, p: Any, ctx: Any, item: Callable[[Any, Any, Any], Any] = item) -> Any:
                        out = [item(x, p, ctx) for x in (v if isinstance(v, list | tuple) else [v])]
                        return _UNSURE if any(x is _UNSURE for x in out) else out

                    convert = items
            elif get_origin(annotation) is None or is_literal_type(annotation):
                convert = leaf(annotation, info)
        if convert is None:
            return original(descriptor)
        return Direct(parameter_info=info, annotation=annotation, convert=convert, descriptor=descriptor)

    build.tidal_direct = True  # type: ignore[attr-defined]
    core.build_runtime_param = build  # type: ignore[attr-defined]
