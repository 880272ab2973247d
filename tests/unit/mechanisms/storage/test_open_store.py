"""Which store and which backend options the settings give (TIDAL_CHECKPOINT_STORE, TIDAL_STORE_*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.config import Settings
from tidal.errors import ConfigError
from tidal.mechanisms.storage import CheckpointStore, open_store
from tidal.mechanisms.storage.backends import FsspecBackend, LocalBackend
from tidal.mechanisms.storage.s3 import MiB, S3Backend
from tidal.mechanisms.storage.store import store_options


def test_local_directory_takes_no_options(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    assert store_options(s) == {}
    store = open_store(s)
    assert isinstance(store.backend, LocalBackend) and store.url == str(tmp_path / "checkpoints")
    store.close()


def test_s3_options_come_from_the_settings() -> None:
    s = Settings(checkpoint_store="s3://bucket/tidal", store_endpoint_url="https://s3.internal:8333",
                 store_access_key_id="AKID", store_secret_access_key="s3cret", store_region="eu-west-1",
                 store_sse="aws:kms", store_sse_kms_key_id="key-1", store_retries=3, store_timeout=7)
    assert "s3cret" not in repr(s)  # the secret is not shown
    assert store_options(s) == {
        "endpoint_url": "https://s3.internal:8333", "key": "AKID", "secret": "s3cret", "region": "eu-west-1",
        "sse": "aws:kms", "sse_kms_key_id": "key-1", "retry": 3, "timeout": 7.0}
    # Nothing given: the AWS chain decides (environment, profile, role).
    assert store_options(Settings(checkpoint_store="s3://bucket")) == {"retry": 6, "timeout": 30.0}


def test_s3_backend_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    store = open_store(Settings(checkpoint_store="s3://bucket/a/b/", store_endpoint_url="http://127.0.0.1:1",
                                store_retries=2, store_concurrency=5))
    b = store.backend
    assert isinstance(b, S3Backend)
    assert (b.bucket, b.prefix, b.url, b.retry.attempts, store.workers) == ("bucket", "a/b", "s3://bucket/a/b", 2, 5)
    config = b.fs.config_kwargs
    assert config["s3"] == {"addressing_style": "path"}  # an endpoint URL: an S3-compatible server
    assert config["retries"]["total_max_attempts"] == 1 and b.fs.retries == 1  # the store's retries only
    assert b.fs.dircache.use_listings_cache is False  # other nodes write too
    assert b.gc_grace == store.gc_grace == 60
    store.close()
    aws = S3Backend("s3://bucket")
    assert aws.fs.config_kwargs["s3"] == {"addressing_style": "auto"} and aws.prefix == ""


def test_bad_s3_urls_and_parts() -> None:
    with pytest.raises(ConfigError, match="not an S3 URL"):
        S3Backend("s3:///prefix")
    with pytest.raises(ConfigError, match="5 MiB"):
        S3Backend("s3://bucket", part_size=4 * MiB)


def test_other_urls_get_retries() -> None:
    s = Settings(checkpoint_store="memory://tidal-test-open-store", store_retries=4)
    store = open_store(s)
    assert isinstance(store.backend, FsspecBackend) and store.backend.retry.attempts == 4
    store.close()


def test_an_s3_url_may_name_its_own_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store per region (tidal server --store REGION=URL) may be on another server than the node's settings
    name: the URL's own endpoint, region and addressing win."""
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    url = "s3://ck-east/tidal?endpoint=http%3A//198.18.0.9%3A8333&region=east-1&addressing=path"
    s = Settings(checkpoint_store="s3://ck-west/tidal", store_endpoint_url="http://198.18.0.8:8333",
                 store_access_key_id="AKID", store_secret_access_key="s3cret")
    store = CheckpointStore(url, **store_options(s, url))
    b = store.backend
    assert isinstance(b, S3Backend)
    assert (b.bucket, b.prefix, b.url) == ("ck-east", "tidal", "s3://ck-east/tidal")
    assert b.fs.endpoint_url == "http://198.18.0.9:8333"
    assert b.fs.client_kwargs["region_name"] == "east-1"
    assert b.fs.key == "AKID"  # the node's credentials
    store.close()
    with pytest.raises(ConfigError) as e:
        CheckpointStore("s3://b/p?endpont=http://x")
    assert e.value.message == "the checkpoint store s3://b/p?endpont=http://x: 'endpont=http://x' is not an option " \
                              "of an S3 store's URL"
