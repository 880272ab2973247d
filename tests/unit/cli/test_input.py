"""What the CLI makes of its input before anything reaches the API: durations, job files and the job's
environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.cli import jobenv
from tidal.cli.jobs import load_job_file, parse_duration
from tidal.errors import ValidationError


def test_durations() -> None:
    assert parse_duration("30") == 30.0
    assert parse_duration("30s") == 30.0
    assert parse_duration("1.5m") == 90.0
    assert parse_duration(" 2h ") == 7200.0
    for bad in ("", "m5", "5 minutes", "-1s"):
        with pytest.raises(ValidationError) as e:
            parse_duration(bad)
        assert e.value.fields["field"] == "checkpoint_every"


def test_job_files(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("name: t\ncommand: python train.py --lr 0.1\ncheckpoint_every: 5m\ntier: premium\n")
    assert load_job_file(f) == {"name": "t", "command": ["sh", "-c", "python train.py --lr 0.1"],
                                "checkpoint_every": 300.0, "tier": "premium"}
    f.write_text("command: [python, train.py]\n")
    assert load_job_file(f)["command"] == ["python", "train.py"]
    for text, what in (("command: [oops\n", "not valid YAML"), ("- a\n- b\n", "mapping")):
        f.write_text(text)
        with pytest.raises(ValidationError) as e:
            load_job_file(f)
        assert what in e.value.message and e.value.fields["field"] == "file"
    with pytest.raises(ValidationError, match="cannot read"):
        load_job_file(tmp_path / "missing.yaml")


CALLER = {"PATH": "/usr/bin", "HOME": "/home/a", "LANG": "C.UTF-8", "LC_ALL": "C", "OMP_NUM_THREADS": "2",
          "MKL_NUM_THREADS": "2", "CONDA_PREFIX": "/opt/conda", "VIRTUAL_ENV": "/v", "PYTHONPATH": "/src",
          "TIDAL_TOKEN": "tdl_secret", "TIDAL_HOME": "/h", "tidal_url": "http://x", "AWS_SECRET_ACCESS_KEY": "k",
          "CUDA_VISIBLE_DEVICES": "0", "GATE": "/tmp/gate", "SSH_AUTH_SOCK": "/tmp/agent"}


def test_a_job_gets_only_the_listed_variables_of_the_caller() -> None:
    assert jobenv.job_env(CALLER) == {
        "PATH": "/usr/bin", "HOME": "/home/a", "LANG": "C.UTF-8", "LC_ALL": "C", "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2", "CONDA_PREFIX": "/opt/conda", "VIRTUAL_ENV": "/v", "PYTHONPATH": "/src"}


def test_env_options_and_job_file_env() -> None:
    env = jobenv.job_env(CALLER, {"LR": 0.1, "STEPS": 10, "PATH": "/opt/bin", "NAME": "x"},
                         ["GATE", "NAME=y", "EMPTY=", "EQ=a=b"])
    assert env["LR"] == "0.1" and env["STEPS"] == "10" and env["PATH"] == "/opt/bin"
    assert env["GATE"] == "/tmp/gate" and env["NAME"] == "y" and env["EMPTY"] == "" and env["EQ"] == "a=b"
    assert "TIDAL_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert jobenv.job_env(CALLER, ["GATE", "X=1"])["X"] == "1"
    for bad, what in ((["MISSING"], "MISSING is not set in your environment"),
                      (["TIDAL_TOKEN"], "TIDAL_TOKEN: variables beginning with TIDAL_"),
                      (["TIDAL_URL=http://elsewhere"], "TIDAL_URL: variables beginning with TIDAL_"),
                      (["=x"], "'' is not a variable name")):
        with pytest.raises(ValidationError) as e:
            jobenv.job_env(CALLER, None, bad)
        assert what in e.value.message and e.value.fields["field"] == "env"
    for file_env in ({"A": ["list"]}, {"A": True}, "A=1", {"TIDAL_HOME": "/x"}):
        with pytest.raises(ValidationError) as e:
            jobenv.job_env(CALLER, file_env)
        assert e.value.fields["field"] == "env"


def test_job_file_env(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("command: [train]\nenv:\n  LR: 0.1\n  MODE: fast\n")
    assert load_job_file(f)["env"] == {"LR": 0.1, "MODE": "fast"}


def test_submit_refuses_a_bad_env_before_sending_with_exit_code_2(tmp_path: Path) -> None:
    # Nothing listens at TIDAL_URL: had the CLI sent the job, it would fail with 'cannot reach' and exit 1.
    base = {"PATH": os.environ["PATH"], "TIDAL_URL": "http://127.0.0.1:9", "TIDAL_TOKEN": "tdl_x",
            "TIDAL_HOME": str(tmp_path)}
    for args, what in ((["--env", "TIDAL_HOME=/elsewhere"], "TIDAL_HOME: variables beginning with TIDAL_"),
                       (["--env", "NOT_SET_ANYWHERE"], "NOT_SET_ANYWHERE is not set in your environment"),
                       (["--env", "=x"], "is not a variable name")):
        p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "submit", *args, "--", "true"],
                           capture_output=True, text=True, env=base, cwd=tmp_path, timeout=60)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert what in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "tidal.cli.main", "logs", "j", "--rank", "-1"],
                       capture_output=True, text=True, env=base, timeout=60)
    assert p.returncode == 2 and "--rank" in p.stderr, p.stderr
