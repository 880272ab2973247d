"""`tidal submit`'s request body: job.yaml's fields, the options over them, each field read one way."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.cli.jobs import _submission, submitted
from tidal.core import JobSpec
from tidal.errors import ValidationError


def test_options_override_the_job_file_and_read_fields_the_same_way(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "job.yaml"
    f.write_text("command: python train.py\nname: y\ntier: standard\ncheckpoint_every: 5m\nranks: 2\n"
                 "workdir: sub\nenv: {LR: 0.1}\n")
    body = _submission(f, {"name": None, "tier": "premium", "ranks": None, "command": []}, ["A=1"])
    env = body.pop("env")
    assert body == {"command": ["sh", "-c", "python train.py"], "name": "y", "tier": "premium",
                    "checkpoint_every": 300.0, "ranks": 2, "workdir": str(tmp_path / "sub")}
    assert env["PATH"] == "/usr/bin" and env["LR"] == "0.1" and env["A"] == "1"
    body = _submission(f, {"command": ["python", "-c", "1"], "checkpoint_every": "90s", "workdir": Path("/w")}, [])
    assert body["command"] == ["python", "-c", "1"] and body["checkpoint_every"] == 90.0
    assert body["workdir"] == "/w"
    # Each field of the body is one JobSpec takes.
    assert set(body) <= submitted() == {f.name for f in JobSpec.submission_fields()}


def test_a_submission_needs_a_command(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        _submission(None, {"command": None, "workdir": tmp_path}, [])
    assert e.value.fields["field"] == "command"
    with pytest.raises(ValidationError, match="bad duration"):
        _submission(None, {"command": ["x"], "checkpoint_every": "soon"}, [])
