"""Fixtures for tests of the control plane without agents: an in-process plane driven by scripted agents."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidal.testing.control import Plane


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path)
    yield p
    p.db.close()
