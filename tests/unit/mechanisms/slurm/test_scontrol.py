from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tidal.mechanisms.slurm import scontrol

JOB = ("JobId=42 JobName=train.sh UserId=alice(1000) PreemptTime=None StdOut=/home/alice/slurm-42.out "
       "StdErr=/home/alice/slurm-42.out Comment=(null) NodeList=n[1-2]")


def test_fields_of_a_one_line_record() -> None:
    f = scontrol.fields(JOB)
    assert f["JobId"] == "42"
    assert f["UserId"] == "alice(1000)"
    assert f["StdOut"] == "/home/alice/slurm-42.out"
    assert f["PreemptTime"] == "None"
    assert f["NodeList"] == "n[1-2]"


def _fake_scontrol(tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "scontrol"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_show_reads_the_first_line_of_the_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_scontrol(tmp_path, '[ "$*" = "-o show node n1" ] && echo "NodeName=n1 NodeAddr=10.0.0.7 State=IDLE"\n',
                   monkeypatch)
    assert scontrol.show("node", "n1") == {"NodeName": "n1", "NodeAddr": "10.0.0.7", "State": "IDLE"}


def test_show_is_empty_where_scontrol_fails_or_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_scontrol(tmp_path, 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n', monkeypatch)
    assert scontrol.show("job", "7") == {}
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert scontrol.show("job", "7") == {}
