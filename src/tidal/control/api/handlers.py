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

from tidal.errors import TidalError


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
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or None
        msg = f"{field}: {err.get('msg')}" if field else str(err.get("msg"))
        return _error({"error": "ValidationError", "message": msg, "hint": None, "field": field}, 422)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # Unknown routes, wrong methods, bodies that are not JSON text: the same error shape as the rest.
        return _error({"error": "HTTPError", "message": str(exc.detail), "hint": None}, exc.status_code,
                      exc.headers)


def _error(body: dict[str, Any], status: int, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error as JSON. Its text may quote the request (a field's name, a value): a lone surrogate there
    has no UTF-8 form, so it is shown escaped instead of failing the answer."""
    return JSONResponse(_escaped(body), status_code=status, headers=headers)


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value
