"""`tidal submit` says when admission against the load deferred the job, as it says when it was demoted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tidal.cli import jobs


class _Api:
    def post(self, path: str, **kw: Any) -> dict[str, Any]:
        assert path == "/v1/jobs" and kw["json"]["runtime"] == 7200
        return {"id": "ab12cd34", "name": "train", "state": "held", "tier": "standard",
                "deferred": "expected attainment 0.50 at standard under the current load, below its target 0.70; "
                            "it starts when that is met"}


def test_submit_prints_the_deferral(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "Api", _Api)
    monkeypatch.setenv("COLUMNS", "250")
    app = typer.Typer()
    jobs.register(app)

    @app.callback()
    def _root() -> None:
        pass

    r = CliRunner().invoke(app, ["submit", "--tier", "standard", "--runtime", "2h", "--workdir", str(tmp_path),
                                 "--", "train"])
    assert r.exit_code == 0, r.output
    assert "submitted job ab12cd34 (train)" in r.output
    assert ("deferred: expected attainment 0.50 at standard under the current load, below its target 0.70; it "
            "starts when that is met") in r.output
