"""What the CLI makes of its input before anything reaches the API: durations and job files."""

from __future__ import annotations

from pathlib import Path

import pytest

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
