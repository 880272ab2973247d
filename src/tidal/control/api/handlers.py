"""Errors as the API answers them: JSON with the error's class, message and hint (and the offending
``field`` for bad input), never a traceback. Each :class:`tidal.errors.TidalError` class answers with its
one ``status_code`` and :meth:`~tidal.errors.TidalError.to_dict` as the body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from tidal.errors import SHOWN_CHARS, TidalError


def error_response(exc: TidalError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return _error(exc.to_dict(), exc.status_code, headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(TidalError)
    async def _tidal_error(_: Request, exc: TidalError) -> JSONResponse:
        # 503 (the database is away a moment): when to try again.
        return error_response(exc, {"Retry-After": "1"} if exc.status_code == 503 else None)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if err.get("type") == "json_invalid":
            return _error({"error": "ValidationError", "message": not_json(exc.body, err), "hint":
                           "send the body as JSON text (Content-Type: application/json)", "field": None}, 422)
        # A part of the path may be a key the caller sent (an unknown field's name): quoted in part only.
        loc = [_cut(str(p)) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or None
        msg = f"{field}: {err.get('msg')}" if field else str(err.get("msg"))
        return _error({"error": "ValidationError", "message": msg, "hint": None, "field": field}, 422)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # Unknown routes, wrong methods, bodies that are not JSON text: the same error shape as the rest.
        return _error({"error": "HTTPError", "message": str(exc.detail), "hint": None}, exc.status_code,
                      exc.headers)


def not_json(doc: Any, err: Mapping[str, Any]) -> str:
    """What is wrong with a request body that is not JSON, and where (as :class:`json.JSONDecodeError` says it:
    FastAPI keeps the parser's message and character offset, the line and column are counted here)."""
    pos = (tuple(err.get("loc", ())) or (None,))[-1]
    why = (err.get("ctx") or {}).get("error") or "it cannot be parsed"
    if isinstance(doc, bytes):
        doc = doc.decode("utf-8", "replace")
    if not isinstance(pos, int) or not isinstance(doc, str):
        return f"the request body is not valid JSON: {why}"
    line = doc.count("\n", 0, pos) + 1
    column = pos - doc.rfind("\n", 0, pos)
    at = "" if why.endswith(" at") else " at"  # "Unterminated string starting at"
    return f"the request body is not valid JSON: {why}{at} line {line}, column {column} (char {pos})"


#: The most characters of any text in an error's body: its message and fields quote what was sent through
#: :func:`tidal.errors.shown` (a short prefix); this bounds any that does not.
MAX_ERROR_TEXT = 1024


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _error(body: dict[str, Any], status: int, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error as JSON. Its text may quote the request (a field's name, a value): a lone surrogate there
    has no UTF-8 form, so it is shown escaped instead of failing the answer; no text is longer than
    :data:`MAX_ERROR_TEXT`."""
    return JSONResponse(_escaped(body), status_code=status, headers=headers)


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return _cut(value, MAX_ERROR_TEXT).encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value
