"""`tidal` itself: --version, shell completion, the config file (and the environment and flags over it), and
errors told in the flags and keys the user typed."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests.integration.cli.conftest import Served, cli_env


def tidal(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidal.cli.main", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60, check=False)


def test_version(tmp_path: Path) -> None:
    p = tidal("--version", env=cli_env(tmp_path))
    assert (p.returncode, p.stdout) == (0, f"tidal {version('tidal')}\n")


def test_completion_scripts_and_candidates(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    bash = tidal("completion", "bash", env=env)
    assert bash.returncode == 0
    assert "_TIDAL_COMPLETE=complete_bash" in bash.stdout and "complete -o default -F _tidal_completion tidal" \
        in bash.stdout
    assert "compdef _tidal_completion tidal" in tidal("completion", "zsh", env=env).stdout
    assert "complete --command tidal" in tidal("completion", "fish", env=env).stdout
    assert tidal("completion", "tcsh", env=env).returncode == 2
    # What the bash script asks tidal for as the user types `tidal ls -o `: the formats.
    ask = {**env, "_TIDAL_COMPLETE": "complete_bash", "COMP_WORDS": "tidal ls -o ", "COMP_CWORD": "3"}
    assert tidal(env=ask).stdout.split() == ["table", "wide", "json", "yaml"]
    ask |= {"COMP_WORDS": "tidal chec", "COMP_CWORD": "1"}
    assert tidal(env=ask).stdout.split() == ["checkpoints"]


def test_config_file_then_environment_then_flags(served_plane: Served, tmp_path: Path) -> None:
    env = {k: v for k, v in served_plane.env.items() if k not in ("TIDAL_URL", "TIDAL_TOKEN")}
    config = Path(env["XDG_CONFIG_HOME"]) / "tidal" / "config"
    config.parent.mkdir(parents=True)
    config.write_text(f'# the cluster at work\nurl = "{served_plane.url}"\ntoken = "{served_plane.plane.user}"\n')
    config.chmod(0o644)
    p = tidal("ls", "-o", "json", env=env)
    assert p.returncode == 1
    assert p.stderr == (f"error: config file {config} holds a token and others may read it\n"
                        f"hint: make it yours alone: chmod 600 {config}\n")
    config.chmod(0o600)
    assert json.loads(tidal("ls", "-o", "json", env=env).stdout) == []

    # The environment over the file, a flag over both.
    nowhere = "http://127.0.0.1:9"
    p = tidal("ls", env={**env, "TIDAL_URL": nowhere})
    assert p.returncode == 1 and f"cannot reach the control plane at {nowhere}" in p.stderr
    assert tidal("--url", served_plane.url, "ls", "-o", "json", env={**env, "TIDAL_URL": nowhere}).returncode == 0
    p = tidal("ls", env={**env, "TIDAL_TOKEN": "tdl_wrong"})
    assert p.returncode == 1 and "error:" in p.stderr
    token = tmp_path / "token"
    token.write_text(served_plane.plane.user + "\n")
    assert tidal("--token-file", str(token), "ls", env={**env, "TIDAL_TOKEN": "tdl_wrong"}).returncode == 0

    # Another file named by --config; a key that is not one.
    other = tmp_path / "other.conf"
    other.write_text("url: http://x\n")
    p = tidal("--config", str(other), "ls", env=env)
    assert p.returncode == 1
    assert p.stderr == (f"error: {other}, line 1: expected key = \"value\", not 'url: http://x'\n"
                        "hint: keys: url, token, ca, ca_fingerprint\n")
    other.write_text("tokn = x\n")
    assert f"error: {other}, line 1: unknown key 'tokn' (did you mean 'token'?)" in \
        tidal("--config", str(other), "ls", env=env).stderr


def test_submit_errors_name_the_flag_or_the_key(served_plane: Served, tmp_path: Path) -> None:
    p = tidal("submit", "--ranks", "2", "--min-devices", "5", "--", "true", env=served_plane.env, cwd=tmp_path)
    assert p.returncode == 2  # refused before anything is sent
    assert p.stderr == ("error: --min-devices (5) must be ≤ --max-devices (2)\n"
                        "hint: see `tidal submit --help`\n")
    job = tmp_path / "job.yaml"
    job.write_text("command: train\nmax_restarts: -1\n")
    p = tidal("submit", "-f", str(job), env=served_plane.env, cwd=tmp_path)
    assert p.stderr.startswith(f"error: {job}: max_restarts must be from 0 to 1000, got -1\n"), p.stderr
    p = tidal("submit", "-f", str(job), "--max-restarts", "-2", env=served_plane.env, cwd=tmp_path)
    assert p.stderr.startswith("error: --max-restarts must be from 0 to 1000, got -2\n"), p.stderr
    p = tidal("submit", "--checkpoint-every", "soon", "--", "true", env=served_plane.env, cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr == "error: --checkpoint-every: bad duration 'soon'\nhint: e.g. 30s, 5m, 1h\n"
