"""The proxy a request to the control plane goes through, from the environment: ``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY`` and ``NO_PROXY`` (any case; lower case first), read as httpx reads them, which the CLI's client
used before it spoke HTTP itself (:mod:`tidal.control.client`):

- ``HTTP_PROXY`` for ``http://`` URLs, ``HTTPS_PROXY`` for ``https://`` ones (a tunnel: ``CONNECT``), else
  ``ALL_PROXY``; a proxy given as ``HOST:PORT`` is ``http://HOST:PORT``; ``user:password@`` in it is sent as
  ``Proxy-Authorization``;
- ``NO_PROXY``: ``*`` (no proxy at all), or names and addresses, comma-separated: ``example.com`` (it and its
  subdomains), ``.example.com`` (its subdomains), ``localhost``, ``10.0.0.1``, ``::1``, ``host:8443`` (that
  port only), ``https://host`` (that scheme only).

Only ``http://`` proxies are spoken to (as a ``socks5://`` one needed a package httpx did not install).
Imports nothing of Tidal but its errors.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from tidal.errors import ConfigError

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Proxy:
    url: str
    host: str
    port: int
    auth: str | None = None  # user:password, decoded

    def headers(self) -> dict[str, str]:
        """What a request through it (or a tunnel's ``CONNECT``) carries for the proxy itself."""
        if self.auth is None:
            return {}
        import base64

        return {"Proxy-Authorization": "Basic " + base64.b64encode(self.auth.encode()).decode()}


def environment_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """``{scheme: value}`` of the ``*_PROXY`` variables (``no`` for NO_PROXY), as :mod:`urllib.request` reads
    them: lower-case names over upper-case ones, an empty lower-case one unsetting it; ``HTTP_PROXY`` ignored in
    a CGI script (``REQUEST_METHOD`` set), where a client could set it."""
    proxies: dict[str, str] = {}
    for name, value in environ.items():
        if value and name.lower().endswith("_proxy"):
            proxies[name.lower()[:-6]] = value
    if "REQUEST_METHOD" in environ:
        proxies.pop("http", None)
    for name, value in environ.items():
        if name.endswith("_proxy"):
            if value:
                proxies[name.lower()[:-6]] = value
            else:
                proxies.pop(name.lower()[:-6], None)
    return proxies


@dataclass(frozen=True)
class _Pattern:
    """A key of httpx's proxy map (``all://``, ``https://``, ``all://*example.com``...): what it matches."""

    scheme: str  # "" for any
    host: str  # "" for any
    port: int | None
    host_regex: re.Pattern[str] | None

    @classmethod
    def of(cls, key: str) -> _Pattern:
        scheme, _, rest = key.partition("://")
        netloc = rest.split("/", 1)[0]
        host, port = netloc, None
        if netloc.startswith("["):
            host, _, tail = netloc[1:].partition("]")
            port = int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else None
        elif netloc.count(":") == 1:
            name, _, number = netloc.partition(":")
            if number.isdigit():
                host, port = name, int(number)
        host = host.lower()
        if host in ("", "*"):
            return cls("" if scheme == "all" else scheme, "", port, None)
        if host.startswith("*."):  # its subdomains, not itself
            regex = re.compile(rf"^.+\.{re.escape(host[2:])}$")
        elif host.startswith("*"):  # itself and its subdomains
            regex = re.compile(rf"^(.+\.)?{re.escape(host[1:])}$")
        else:
            regex = re.compile(rf"^{re.escape(host)}$")
        return cls("" if scheme == "all" else scheme, host, port, regex)

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        if self.scheme and self.scheme != scheme:
            return False
        if self.host_regex is not None and not self.host_regex.match(host):
            return False
        return self.port is None or self.port == port

    @property
    def priority(self) -> tuple[bool, int, int]:
        """The most specific first: with a port, then the longest host, then with a scheme."""
        return (self.port is None, -len(self.host), -len(self.scheme))


def _mounts(proxies: Mapping[str, str]) -> list[tuple[_Pattern, str | None]]:
    """httpx's proxy map from the environment: each pattern and its proxy (None: none, from NO_PROXY)."""
    out: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if proxies.get(scheme):
            value = proxies[scheme]
            out[f"{scheme}://"] = value if "://" in value else f"http://{value}"
    for entry in (h.strip() for h in proxies.get("no", "").split(",")):
        if entry == "*":
            return []
        if not entry:
            continue
        if "://" in entry:
            out[entry] = None
        elif _is_ipv4(entry) or entry.lower() == "localhost":
            out[f"all://{entry}"] = None
        elif _is_ipv6(entry):
            out[f"all://[{entry}]"] = None
        else:
            out[f"all://*{entry}"] = None
    return sorted(((_Pattern.of(k), v) for k, v in out.items()), key=lambda m: m[0].priority)


def _is_ipv4(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv4Address(host.split("/")[0])
    except ValueError:
        return False
    return True


def _is_ipv6(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv6Address(host.split("/")[0])
    except ValueError:
        return False
    return True


def proxy_for(scheme: str, host: str, port: int, environ: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy a request to ``scheme://host:port`` goes through, or None: straight to it."""
    proxies = environment_proxies(os.environ if environ is None else environ)
    if not proxies:
        return None
    given = None if port == DEFAULT_PORTS.get(scheme) else port  # as a URL's port is compared: None by default
    for pattern, url in _mounts(proxies):
        if pattern.matches(scheme, host.lower(), given):
            return None if url is None else _proxy(url)
    return None


def _proxy(url: str) -> Proxy:
    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        raise ConfigError(f"the proxy {url} is not one the tidal CLI can speak to (only http:// proxies)",
                          hint="give an http:// proxy in HTTP_PROXY/HTTPS_PROXY/ALL_PROXY, or reach the control "
                               "plane without one: add its host to NO_PROXY")
    try:
        port = parts.port or 80
    except ValueError:
        raise ConfigError(f"the proxy {url} has no valid port", hint="give it as http://HOST:PORT") from None
    auth = None
    if parts.username is not None:
        auth = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return Proxy(url, parts.hostname or "", port, auth)
