"""Fixtures for tests that run real processes under real CRIU."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidal.mechanisms.criu.provision import find_criu
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec, become_subreaper
from tidal.mechanisms.storage import CheckpointStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session", autouse=True)
def _subreaper() -> None:
    # Restored ranks are re-parented to the nearest subreaper: this test process.
    become_subreaper()


@pytest.fixture(scope="session")
def criu() -> object:
    # No skip: `make test` provisions CRIU, so a missing one is a failure to see.
    return find_criu()


@dataclass
class Cluster:
    root: Path
    workdir: Path
    store: CheckpointStore
    nodes: list[NodeRoot]

    def spec(self, argv: list[str], job_id: str = "job", rank: int = 0, **kw: object) -> RankSpec:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV"))}
        return RankSpec(job_id, rank, tuple(argv), self.workdir, env, **kw)  # type: ignore[arg-type]


@pytest.fixture
def cluster(tmp_path: Path, criu: object) -> Iterator[Cluster]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    # Node names key the ranks' cgroups: unique per test, so that test runs side by side never meet.
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:6]
    nodes = [NodeRoot(f"node-{i}-{tag}", tmp_path / f"node-{i}") for i in (1, 2, 3)]
    yield Cluster(tmp_path, workdir, CheckpointStore(str(tmp_path / "store")), nodes)
    for n in nodes:  # images a test's jobs kept in /dev/shm for their next dump
        n.clear_staging()


def wait_until(cond: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def wait_for_line(path: Path, pattern: str, timeout: float = 60) -> None:
    rx = re.compile(pattern, re.M)

    def seen() -> bool:
        try:
            return rx.search(path.read_text(errors="replace")) is not None
        except FileNotFoundError:
            return False

    wait_until(seen, timeout, f"{pattern!r} in {path}")


def reference_run(argv: list[str], workdir: Path, env: dict[str, str]) -> bytes:
    """The uninterrupted run: the same command, same environment, no Tidal."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=300, check=True)
    return out.stdout


def train_argv(*extra: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / "train.py"), *extra]
