"""A distributed job that makes no progress at all is visible as such: an event and `tidal show`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tidal.testing import wait_until

pytestmark = [pytest.mark.criu, pytest.mark.torch, pytest.mark.slow]
HANG = Path(__file__).resolve().parents[2] / "examples" / "hang.py"


def test_a_hung_job_is_reported_stalled(make_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_STALL_AFTER", "3")
    c = make_cluster(nodes=1, devices=2)
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--ranks", "2", "--", sys.executable, str(HANG), cwd=work,
                env={"OMP_NUM_THREADS": "1"}).stdout.strip()
    c.wait_state(job, "running", timeout=120)

    def stalled() -> list[dict]:
        return [e for e in c.job(job)["events"] if e["kind"] == "stalled"]

    (ev,) = wait_until(stalled, timeout=120, what="the stalled event")
    assert ev["detail"].startswith("no step and no collective for "), ev["detail"]
    assert f"`tidal logs {job} --rank R` shows what each printed last" in ev["detail"]
    show = c.cli("show", job).stdout
    assert "stalled: no step and no collective since" in show, show
    assert c.job(job)["state"] == "running"
    c.cli("cancel", job)
