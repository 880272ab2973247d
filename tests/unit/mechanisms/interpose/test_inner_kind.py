"""Which inner group a backend name gives the Tidal group, and NCCL's RAS kept off around the first NCCL
collective (logic only; NCCL itself runs in tests/gpu)."""

from __future__ import annotations

import os

import pytest

from tidal.mechanisms.interpose import rankside
from tidal.mechanisms.interpose.rankside import inner_kind


@pytest.mark.parametrize(("backend", "kind"), [
    (None, "gloo"), ("gloo", "gloo"), ("cpu:gloo", "gloo"), ("nccl", "nccl"), ("NCCL", "nccl"),
    ("cuda:nccl", "nccl"), ("cpu:gloo,cuda:nccl", None), ("mpi", None), ("ucc", None),
])
def test_backend_names(backend: str | None, kind: str | None) -> None:
    assert inner_kind(backend) == kind


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    seen: list[bool] = []
    monkeypatch.setattr(rankside, "_NCCL_SEEN", seen)
    return seen


def test_first_nccl_collective_runs_with_ras_off_and_the_script_never_sees_it(
        monkeypatch: pytest.MonkeyPatch, fresh: list[bool]) -> None:
    monkeypatch.delenv("NCCL_RAS_ENABLE", raising=False)
    during = rankside._without_nccl_ras(lambda: os.environ.get("NCCL_RAS_ENABLE"))
    assert during == "0" and "NCCL_RAS_ENABLE" not in os.environ and fresh == [True]


def test_ras_as_the_script_set_it_is_left_alone(monkeypatch: pytest.MonkeyPatch, fresh: list[bool]) -> None:
    monkeypatch.setenv("NCCL_RAS_ENABLE", "1")
    assert rankside._without_nccl_ras(lambda: os.environ["NCCL_RAS_ENABLE"]) == "1"
    assert os.environ["NCCL_RAS_ENABLE"] == "1" and fresh == [True]


def test_ras_variable_removed_when_the_collective_fails(monkeypatch: pytest.MonkeyPatch, fresh: list[bool]) -> None:
    monkeypatch.delenv("NCCL_RAS_ENABLE", raising=False)

    def boom() -> None:
        raise RuntimeError("NCCL error")

    with pytest.raises(RuntimeError, match="NCCL error"):
        rankside._without_nccl_ras(boom)
    assert "NCCL_RAS_ENABLE" not in os.environ
