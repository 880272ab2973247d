"""`tidal doctor` on this machine, as a user runs it: a subprocess of the installed command."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tidal.agent.gpuchecks import probe_torch
from tidal.mechanisms.criu.features import probe_feature
from tidal.mechanisms.criu.provision import find_criu

pytestmark = pytest.mark.criu

TIDAL = Path(sys.executable).parent / "tidal"


def _doctor(env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    out = subprocess.run([str(TIDAL), "doctor", "--json"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})}, check=False)
    elapsed = time.monotonic() - t0
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout), elapsed


def _rows(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["checks"]}


def test_doctor_on_this_machine(tmp_path: Path) -> None:
    try:
        criu = find_criu()
    except Exception as exc:  # no CRIU here: `make test` provisions one
        pytest.skip(f"no working CRIU: {exc}")
    # TIDAL_HOME pointing elsewhere (an empty temporary directory) must not hide the provisioned CRIU.
    code, data, elapsed = _doctor({"TIDAL_HOME": str(tmp_path / "home")})
    rows = _rows(data)
    assert elapsed < 5, f"tidal doctor took {elapsed:.1f}s"
    assert rows["kernel"]["status"] == "ok"
    assert rows["criu"]["status"] == "ok", rows["criu"]
    version = tuple(int(x) for x in rows["criu"]["detail"].split(",")[0].split("."))
    assert version >= (4, 0)
    assert rows["criu check"]["status"] == "ok"
    # A real dump of another account's process: `make test` provisions what this machine needs for it.
    assert rows["criu: other accounts"]["status"] == "ok", rows["criu: other accounts"]
    assert rows["TIDAL_HOME"]["status"] == "ok" and str(tmp_path / "home") in rows["TIDAL_HOME"]["detail"]

    # mem_dirty_track is reported as whatever `criu check --feature` says (OFF on these kernels).
    probe = probe_feature(criu.argv, "mem_dirty_track")
    dirty = rows["criu: mem_dirty_track"]
    assert not dirty["required"]
    if probe.supported:
        assert dirty["status"] == "ok"
    else:
        assert dirty["status"] == "warn" and probe.message in dirty["detail"] and dirty["fix"]

    # Warnings never fail; the exit code follows the required rows.
    failed = [c["name"] for c in data["checks"] if c["required"] and c["status"] == "missing"]
    assert code == (1 if failed else 0)
    assert data["ok"] is (not failed)
    assert all(c["fix"] for c in data["checks"] if c["status"] != "ok")


def test_doctor_does_not_import_torch() -> None:
    code = ("import sys; from tidal.cli import doctor; doctor.run_checks(); "
            "assert 'torch' not in sys.modules, 'doctor imported torch'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr


def test_doctor_says_when_jobs_of_other_accounts_cannot_be_checkpointed(tmp_path: Path) -> None:
    from tidal.mechanisms.checks import check_other_accounts
    from tidal.mechanisms.criu import rlimits

    criu = find_criu()
    row = check_other_accounts(criu, prefix=tmp_path / "empty-prefix")  # as if `make criu` had not run
    if rlimits.reads_other_accounts():
        assert row.status == "ok"  # root may read any task's limits here: nothing else is needed
    else:
        assert row.status == "missing" and row.required
        assert "Can't get rlimit" in row.detail and "make criu" in row.fix
    assert check_other_accounts(criu).status == "ok"


def test_the_nccl_probe_asks_the_real_torch_in_a_child_process() -> None:
    """The probe behind the doctor's nccl row, run for real (a child Python importing torch). Here torch is a
    CPU build: what a CUDA build answers is for a GPU machine to show."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    probe = probe_torch()
    assert probe is not None and probe["torch"] == importlib.metadata.version("torch")
    if probe["cuda"] is None:
        assert probe == {"torch": probe["torch"], "cuda": None, "available": False, "nccl": None}
    assert probe_torch("/nonexistent/python") == {"error": "[Errno 2] No such file or directory: '/nonexistent/python'"}
