"""The CLI's config file, and where each setting comes from: flag, then environment, then the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.config import Connection, config_path, parse, read_config
from tidal.errors import ConfigError


def test_where_the_file_is(tmp_path: Path) -> None:
    assert config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/tidal/config")
    assert config_path({"TIDAL_CONFIG": "/y/c", "XDG_CONFIG_HOME": "/x"}) == Path("/y/c")
    assert config_path({}) == Path("~/.config/tidal/config").expanduser()


def test_toml_or_plain_lines() -> None:
    text = '# mine\nurl = "https://t:8470"\n\nTOKEN=tdl_abc\nca_fingerprint = \'AB:CD\'\n'
    assert parse(text, Path("c")) == {"url": "https://t:8470", "token": "tdl_abc", "ca_fingerprint": "AB:CD"}
    with pytest.raises(ConfigError) as e:
        parse("urll = x\n", Path("c"))
    assert e.value.message == "c, line 1: unknown key 'urll' (did you mean 'url'?)"
    assert e.value.hint == "keys: url, token, ca, ca_fingerprint"
    with pytest.raises(ConfigError, match="line 2: expected key"):
        parse("url = x\n[server]\n", Path("c"))


def test_a_file_with_a_token_must_be_private(tmp_path: Path) -> None:
    f = tmp_path / "config"
    f.write_text("url = https://t\n")
    f.chmod(0o644)
    assert read_config(f) == {"url": "https://t"}  # no token: nothing secret
    f.write_text("token = tdl_x\n")
    with pytest.raises(ConfigError) as e:
        read_config(f)
    assert e.value.message == f"config file {f} holds a token and others may read it"
    assert e.value.hint == f"make it yours alone: chmod 600 {f}"
    f.chmod(0o600)
    assert read_config(f) == {"token": "tdl_x"}
    assert read_config(tmp_path / "none") == {}
    with pytest.raises(ConfigError, match="does not exist"):
        read_config(tmp_path / "none", required=True)


def test_flags_over_environment_over_file(tmp_path: Path) -> None:
    f = tmp_path / "tidal" / "config"
    f.parent.mkdir()
    f.write_text("url = https://file\ntoken = tdl_file\nca = ca.pem\n")
    f.chmod(0o600)
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert Connection().settings(env) == {"url": "https://file", "token": "tdl_file",
                                          "ca": str(tmp_path / "tidal" / "ca.pem"), "ca_fingerprint": None}
    env |= {"TIDAL_URL": "https://env", "TIDAL_CA_FINGERPRINT": "AB"}
    got = Connection().settings(env)
    assert (got["url"], got["token"], got["ca_fingerprint"]) == ("https://env", "tdl_file", "AB")
    got = Connection(flags={"url": "https://flag", "token": "tdl_flag"}).settings(env)
    assert (got["url"], got["token"]) == ("https://flag", "tdl_flag")
    # An empty variable is as good as unset.
    assert Connection().settings({**env, "TIDAL_URL": ""})["url"] == "https://file"
