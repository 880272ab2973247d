"""The proxy the control plane's client goes through is the one httpx chose from the same environment (the
client spoke through httpx before): held here against httpx's own reading, case by case."""

from __future__ import annotations

import pytest
from httpx import URL
from httpx._utils import URLPattern, get_environment_proxies

from tidal.errors import ConfigError
from tidal.proxies import Proxy, environment_proxies, proxy_for

ENVIRONMENTS = [
    {},
    {"HTTP_PROXY": "http://proxy:3128"},
    {"HTTPS_PROXY": "proxy:8080"},
    {"ALL_PROXY": "http://all:1"},
    {"HTTP_PROXY": "http://upper:1", "http_proxy": "http://lower:2"},
    {"HTTP_PROXY": "http://upper:1", "http_proxy": ""},
    {"HTTP_PROXY": "http://p:1", "REQUEST_METHOD": "GET"},  # a CGI script: HTTP_PROXY may be a client's
    {"ALL_PROXY": "http://all:1", "HTTPS_PROXY": "http://tls:2"},
    {"ALL_PROXY": "http://all:1", "NO_PROXY": "*"},
    {"ALL_PROXY": "http://all:1", "NO_PROXY": "example.com, .internal,localhost,10.0.0.7,::1"},
    {"ALL_PROXY": "http://all:1", "no_proxy": "api.test:8470,https://secure.test"},
    {"HTTP_PROXY": "http://u:p%40ss@proxy:3128"},
]
URLS = ["http://api.test:8470", "https://api.test:8470", "http://example.com", "https://www.example.com",
        "http://notexample.com", "http://a.internal", "http://internal", "http://localhost:8470", "http://10.0.0.7:80",
        "http://[::1]:8470", "https://secure.test", "http://secure.test", "http://api.test:9999", "https://api.test"]


def _httpx_choice(environ: dict[str, str], url: str, monkeypatch: pytest.MonkeyPatch) -> str | None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    mounts = sorted((URLPattern(k), v) for k, v in get_environment_proxies().items())
    for pattern, proxy in mounts:
        if pattern.matches(URL(url)):
            return proxy
    return None


@pytest.mark.parametrize("environ", ENVIRONMENTS)
def test_the_proxy_is_the_one_httpx_chose(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for url in URLS:
        u = URL(url)
        want = _httpx_choice(environ, url, monkeypatch)
        got = proxy_for(u.scheme, u.host, u.port or {"http": 80, "https": 443}[u.scheme], environ)
        assert (got.url if got else None) == want, (environ, url)


def test_the_environment_is_read_as_urllib_reads_it() -> None:
    assert environment_proxies({"HTTP_PROXY": "a", "http_proxy": "b", "No_Proxy": "c", "FOO": "d"}) == \
        {"http": "b", "no": "c"}


def test_a_proxys_credentials_are_sent_to_it() -> None:
    p = proxy_for("http", "api.test", 80, {"HTTP_PROXY": "http://u:p%40ss@proxy:3128"})
    assert p == Proxy("http://u:p%40ss@proxy:3128", "proxy", 3128, "u:p@ss")
    assert p.headers() == {"Proxy-Authorization": "Basic dTpwQHNz"}
    assert proxy_for("http", "api.test", 80, {"HTTP_PROXY": "proxy"}) == Proxy("http://proxy", "proxy", 80)


def test_a_proxy_it_cannot_speak_to_is_refused_saying_what_to_do() -> None:
    with pytest.raises(ConfigError) as err:
        proxy_for("https", "api.test", 443, {"HTTPS_PROXY": "socks5://127.0.0.1:1080"})
    assert err.value.message == "the proxy socks5://127.0.0.1:1080 is not one the tidal CLI can speak to (only " \
                                "http:// proxies)"
    assert err.value.hint and "NO_PROXY" in err.value.hint
