"""Which inner group a backend name gives the Tidal group (logic only; NCCL itself runs in tests/gpu)."""

from __future__ import annotations

import pytest

from tidal.mechanisms.interpose.rankside import inner_kind


@pytest.mark.parametrize(("backend", "kind"), [
    (None, "gloo"), ("gloo", "gloo"), ("cpu:gloo", "gloo"), ("nccl", "nccl"), ("NCCL", "nccl"),
    ("cuda:nccl", "nccl"), ("cpu:gloo,cuda:nccl", None), ("mpi", None), ("ucc", None),
])
def test_backend_names(backend: str | None, kind: str | None) -> None:
    assert inner_kind(backend) == kind
