"""`tidal submit` refuses what it does not understand before anything is sent (exit code 2): unknown keys of a
job file, with the closest valid key suggested, and bad values, each error naming the flag or the job file's
key the user typed, never a field name of Tidal's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.cli.jobs import _submission, load_job_file
from tidal.errors import ValidationError


def _submit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Nothing listens at TIDAL_URL: had the CLI sent the job, it would fail with 'cannot reach' and exit 1.
    env = {"PATH": os.environ["PATH"], "TIDAL_URL": "http://127.0.0.1:9", "TIDAL_TOKEN": "tdl_x",
           "TIDAL_HOME": str(tmp_path), "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "tidal.cli.main", "submit", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)


KEYS = "valid keys: command, workdir, name, tier, ranks, min_devices, max_devices, env, checkpoint_every, runtime, " \
       "max_restarts, project, region, cluster"


@pytest.mark.parametrize(("yaml", "flags", "error", "hint"), [
    ("command: python train.py\nrankz: 4\n", [], "unknown key 'rankz' in job.yaml: did you mean 'ranks'?", KEYS),
    ("command: python train.py\nmin_device: 2\n", [],
     "unknown key 'min_device' in job.yaml: did you mean 'min_devices'?", KEYS),
    ("command: python train.py\nshoe_size: 44\n", [], "unknown key 'shoe_size' in job.yaml", KEYS),
    ("command: python train.py\ntier: premum\n", [],
     "job.yaml: unknown tier 'premum': did you mean 'premium'?", "valid tiers: premium, standard, basic"),
    ("command: python train.py\n", ["--tier", "premum"],
     "--tier: unknown tier 'premum': did you mean 'premium'?", "valid tiers: premium, standard, basic"),
    ("command: python train.py\nranks: 4\nmin_devices: 3\nmax_devices: 2\n", [],
     "job.yaml: min_devices (3) must be ≤ max_devices (2)", None),
    ("command: python train.py\nranks: 4\nmin_devices: 3\n", ["--max-devices", "2"],
     "job.yaml: min_devices (3) must be ≤ --max-devices (2)", None),
    ("command: python train.py\n", ["--ranks", "4", "--min-devices", "3", "--max-devices", "2"],
     "--min-devices (3) must be ≤ --max-devices (2)", None),
    ("command: python train.py\n", ["--ranks", "2", "--max-devices", "3"], "--max-devices (3) must be ≤ --ranks (2)",
     None),
    ("command: python train.py\n", ["--min-devices", "0"], "--min-devices must be ≥ 1, got 0", None),
    ("command: python train.py\nranks: four\n", [],
     "job.yaml: ranks: Input should be a valid integer, unable to parse string as an integer", None),
    ("command: python train.py\nranks: 0\n", [], "job.yaml: ranks must be an integer from 1 to 4096, got 0", None),
    ("command: python train.py\n", ["--max-restarts", "-1"], "--max-restarts must be from 0 to 1000, got -1", None),
])
def test_submit_refuses_with_the_users_terms(tmp_path: Path, yaml: str, flags: list[str], error: str,
                                             hint: str | None) -> None:
    (tmp_path / "job.yaml").write_text(yaml)
    p = _submit(tmp_path, "-f", "job.yaml", *flags)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert lines[0] == f"error: {error}", p.stderr
    assert lines[1:] == [f"hint: {hint or 'see `tidal submit --help`'}"], p.stderr


def test_a_job_files_path_is_named_as_given(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "a.yaml").write_text("command: [train]\nrankz: 2\n")
    with pytest.raises(ValidationError) as e:
        load_job_file(tmp_path / "exp" / "a.yaml")
    assert e.value.message == f"unknown key 'rankz' in {tmp_path / 'exp' / 'a.yaml'}: did you mean 'ranks'?"
    assert e.value.fields["field"] == "rankz"


def test_a_flag_over_a_bad_key_is_what_counts(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("command: [train]\ntier: premum\n")
    body = _submission(f, {"tier": "premium", "workdir": tmp_path}, [])  # the flag replaces the file's value
    assert body["tier"] == "premium"
    with pytest.raises(ValidationError) as e:
        _submission(f, {"workdir": tmp_path}, [])
    assert e.value.message == f"{f}: unknown tier 'premum': did you mean 'premium'?"
