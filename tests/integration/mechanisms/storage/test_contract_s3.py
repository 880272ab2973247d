"""The checkpoint store's contract suite (tests/unit/mechanisms/storage/test_contract.py), every test of it,
against a real S3 server: SeaweedFS on loopback (the session's ``seaweedfs`` fixture), through s3fs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.mechanisms.storage.test_contract import *  # noqa: F403 - the suite's tests, collected here again
from tests.unit.mechanisms.storage.test_contract import CHUNK
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing.seaweedfs import SeaweedFS

pytestmark = pytest.mark.s3


@pytest.fixture
def store(seaweedfs: SeaweedFS, s3_url: str) -> Iterator[CheckpointStore]:
    # gc_grace=0: the suite checks that garbage collection removes chunks at once (test_s3.py checks the grace).
    s = CheckpointStore(s3_url, chunk_size=CHUNK, gc_grace=0, **seaweedfs.store_options())
    yield s
    s.backend.delete_tree("")
    s.close()
