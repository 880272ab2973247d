"""The CLI's client of the control-plane API: where it is, which token to use, errors as TidalErrors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from tidal.config import load_settings
from tidal.errors import Conflict, Forbidden, NotFound, TidalError, Unauthorized, ValidationError

_BY_STATUS: dict[int, type[TidalError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
                                           422: ValidationError, 400: ValidationError}


def _endpoint() -> tuple[str, Path]:
    home = Path(load_settings().home)
    url = os.environ.get("TIDAL_URL")
    if url is None:
        from tidal.control.clusterfile import load

        st = load(home)
        if st is None:
            raise TidalError("no control plane is configured", hint="start a local cluster with `tidal up`, "
                             "or set TIDAL_URL and TIDAL_TOKEN")
        url = st.url
    return url, home


class Api:
    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        if url is None:
            url, home = _endpoint()
        else:
            home = Path(load_settings().home)
        if token is None:
            token = os.environ.get("TIDAL_TOKEN")
        if token is None:
            path = home / "tokens" / "user.token"
            if not path.exists():
                raise Unauthorized("no API token",
                                   hint=f"set TIDAL_TOKEN, or run `tidal up` to create {path}")
            token = path.read_text().strip()
        self.url = url
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise TidalError(f"cannot reach the control plane at {self.url} ({exc})",
                             hint="is it running? `tidal status`") from None
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"message": r.text}
            cls = _BY_STATUS.get(r.status_code, TidalError)
            fields = {k: v for k, v in body.items() if k not in ("error", "message", "hint")}
            message = str(body.get("message") or body.get("detail") or r.text)
            raise cls(message, hint=body.get("hint"), **fields)
        return r

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw).json()
