"""A local cluster's processes get the settings they share, the S3 store's too, whatever the caller's
environment says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.config import Settings
from tidal.control.localcluster import _env


def test_store_settings_reach_the_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_STORE_PROFILE", "the-callers")
    env = _env(Settings(home=tmp_path, checkpoint_store="s3://bucket/tidal", store_endpoint_url="http://s3:8333",
                        store_access_key_id="AKID", store_secret_access_key="s3cret", store_retries=3,
                        store_profile=None))
    assert env["TIDAL_CHECKPOINT_STORE"] == "s3://bucket/tidal"
    assert env["TIDAL_STORE_ENDPOINT_URL"] == "http://s3:8333"
    assert env["TIDAL_STORE_ACCESS_KEY_ID"] == "AKID"
    assert env["TIDAL_STORE_SECRET_ACCESS_KEY"] == "s3cret"
    assert env["TIDAL_STORE_RETRIES"] == "3"
    assert "TIDAL_STORE_PROFILE" not in env  # the cluster's settings say none: the caller's is not passed on
