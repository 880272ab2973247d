"""Where the CLI finds the control plane, its token and how to trust it: flags, then the environment, then the
config file, then (URL and token) the local cluster of `tidal up`.

| key              | flag                 | environment            | meaning                                        |
|------------------|----------------------|------------------------|------------------------------------------------|
| `url`            | `--url`              | `TIDAL_URL`            | the control plane's URL                        |
| `token`          | `--token-file FILE`  | `TIDAL_TOKEN`          | your API token                                 |
| `ca`             | `--ca FILE`          | `TIDAL_CA`             | the CA certificate (PEM) the server's chains to |
| `ca_fingerprint` | `--ca-fingerprint`   | `TIDAL_CA_FINGERPRINT` | or its SHA-256 fingerprint, pinned             |

The file is ``$XDG_CONFIG_HOME/tidal/config`` (``~/.config/tidal/config``), or the one ``--config`` or
``TIDAL_CONFIG`` names: one ``key = "value"`` per line (TOML's form; the quotes may be left out), ``#``
comments. A file that holds a token must be readable by its owner alone (``chmod 600``): the CLI refuses it
otherwise. A token is never taken on the command line, where every account of the machine may read it.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tidal.errors import ConfigError

if TYPE_CHECKING:
    from tidal.control.client import Client

KEYS = {"url": "TIDAL_URL", "token": "TIDAL_TOKEN", "ca": "TIDAL_CA", "ca_fingerprint": "TIDAL_CA_FINGERPRINT"}
FLAGS = {"url": "--url", "token": "--token-file", "ca": "--ca", "ca_fingerprint": "--ca-fingerprint"}


def config_path(environ: Mapping[str, str]) -> Path:
    """``TIDAL_CONFIG``, else ``$XDG_CONFIG_HOME/tidal/config``, else ``~/.config/tidal/config``."""
    if environ.get("TIDAL_CONFIG"):
        return Path(environ["TIDAL_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "tidal" / "config"


def read_config(path: Path, required: bool = False) -> dict[str, str]:
    """The file's keys and values; none when there is no file (unless ``required``: it was named)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {path} does not exist",
                              hint="create it, or leave out --config/TIDAL_CONFIG for ~/.config/tidal/config") from None
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}", hint=f"check its permissions: ls -l {path}"
                          ) from None
    values = parse(text, path)
    if "token" in values and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"config file {path} holds a token and others may read it",
                          hint=f"make it yours alone: chmod 600 {path}")
    if "ca" in values:
        values["ca"] = str((path.parent / Path(values["ca"]).expanduser()).absolute())
    return values


def parse(text: str, path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key:
            raise ConfigError(f"{path}, line {n}: expected key = \"value\", not {line!r}",
                              hint="keys: " + ", ".join(KEYS))
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            raise ConfigError(f"{path}, line {n}: unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close
                                                                           else ""),
                              hint="keys: " + ", ".join(KEYS))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key] = value
    return out


@dataclass
class Connection:
    """The flags given to ``tidal`` itself (set by its root callback), read with the environment and the config
    file when a command first needs the control plane."""

    flags: dict[str, str] = field(default_factory=dict)
    config: Path | None = None

    def settings(self, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
        """url, token, ca and ca_fingerprint: each from its flag, else the environment, else the config file
        (None: the client's default, the local cluster's URL and token, the system's trust store)."""
        env = os.environ if environ is None else environ
        path = self.config or config_path(env)
        from_file = read_config(path, required=self.config is not None or bool(env.get("TIDAL_CONFIG")))
        out: dict[str, str | None] = {}
        for key, var in KEYS.items():
            out[key] = self.flags.get(key) or env.get(var) or from_file.get(key) or None
        return out

    def client(self, who: str = "user") -> Client:
        from tidal.control.client import Client  # here: a command that never calls the control plane needs none

        s = self.settings()
        return Client(url=s["url"], token=s["token"], who=who, ca=s["ca"], ca_fingerprint=s["ca_fingerprint"])


connection = Connection()


def token_from_file(path: Path) -> str:
    """The token ``--token-file`` names (its first line)."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: cannot read it ({exc.strerror})",
                          hint="give a file that holds your API token") from None
    if not token:
        raise ConfigError(f"--token-file {path} is empty", hint="give a file that holds your API token")
    return token
