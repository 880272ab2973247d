"""The in-process comparison of ``benchmarks/interpose.py --only-paired``: blocks of steps on the interposer's
group against the native blocks around them, read from rank 0's lines."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import interpose

        yield interpose
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def lines(steps: int, block: int, wall: dict[str, float], cpu: dict[str, float], thread: dict[str, float],
          skip: int | None = None) -> str:
    """Rank 0's output of a paired run whose steps take ``wall[via]`` seconds (``cpu``, ``thread``: CPU time)."""
    t = c = th = 0.0
    out = ["rank 1 step 0 t 0.5 cpu 0.5 loss 0x0p+0 via native thread 0.5"]  # another rank's: not read
    for step in range(steps):
        via = "default" if (step // block) % 2 == 0 else "native"
        t, c, th = t + wall[via], c + cpu[via], th + thread[via]
        if step != skip:
            out.append(f"rank 0 step {step} t {t:.6f} cpu {c:.6f} loss 0x1.8p-1 via {via} thread {th:.6f}")
    return "\n".join(out) + "\n"


def test_blocks_on_the_interposers_group_are_compared_with_the_native_blocks_around_them(bench: Any) -> None:
    text = lines(100, 5, wall={"default": 0.011, "native": 0.010}, cpu={"default": 0.002, "native": 0.002},
                 thread={"default": 0.0015, "native": 0.0012})
    r = bench.paired_blocks(text, 5)
    # 20 blocks; the first (no line before it) and the next two (warm-up) are not compared, nor the last
    # default block (no native block after it).
    assert r["blocks"] == 19
    assert r["wall"]["pairs"] == 8
    assert r["wall"]["overhead_fraction"] == pytest.approx(0.10, abs=1e-3)
    assert r["wall"]["default_step_s"] == pytest.approx(0.011, abs=1e-6)
    assert r["wall"]["native_step_s"] == pytest.approx(0.010, abs=1e-6)
    assert r["cpu"]["overhead_fraction"] == pytest.approx(0.0, abs=1e-3)
    assert r["thread_cpu"]["overhead_fraction"] == pytest.approx(0.25, abs=1e-3)
    lo, hi = r["thread_cpu"]["interval90"]
    assert lo == pytest.approx(0.25, abs=1e-3) and hi == pytest.approx(0.25, abs=1e-3)


def test_a_missing_line_is_named(bench: Any) -> None:
    text = lines(40, 5, wall={"default": 0.01, "native": 0.01}, cpu={"default": 0.002, "native": 0.002},
                 thread={"default": 0.001, "native": 0.001}, skip=19)
    with pytest.raises(bench.BenchmarkError, match="rank 0 printed no paired line for step 19"):
        bench.paired_blocks(text, 5)
