"""Fixtures for tests that run real processes under real CRIU."""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.ranks import Cluster
from tidal.mechanisms.criu.provision import find_criu
from tidal.mechanisms.criu.rank import PR_SET_CHILD_SUBREAPER, NodeRoot, become_subreaper
from tidal.mechanisms.storage import CheckpointStore


@pytest.fixture(scope="package", autouse=True)
def _subreaper() -> Iterator[None]:
    # Restored ranks are re-parented to the nearest subreaper: this test process. Only for these tests: a test
    # process that stays one adopts every orphan of the later tests and never reaps it (a Slurm step over
    # test hosts then waits a minute for its process group to end, held by such a zombie).
    become_subreaper()
    yield
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture(scope="session")
def criu() -> object:
    # No skip: `make test` provisions CRIU, so a missing one is a failure to see.
    return find_criu()


@pytest.fixture
def cluster(tmp_path: Path, criu: object) -> Iterator[Cluster]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    # NodeRoot names key the ranks' cgroups: unique per test, so that test runs side by side never meet.
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:6]
    nodes = [NodeRoot(f"node-{i}-{tag}", tmp_path / f"node-{i}") for i in (1, 2, 3)]
    yield Cluster(tmp_path, workdir, CheckpointStore(str(tmp_path / "store")), nodes)
    for n in nodes:  # images a test's jobs kept in /dev/shm for their next dump
        n.clear_staging()
