"""`make demo` runs `tidal demo`: the story must complete and find the outputs identical."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_story_end_to_end(tmp_path: Path) -> None:
    tidal = Path(sys.executable).with_name("tidal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env.update(TIDAL_HOME=str(tmp_path / "home"), COLUMNS="120")
    out = subprocess.run([str(tidal), "demo"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for line in ("Premium job", "preempts the basic job", "resumes where there is room", "we migrate the basic job",
                 "Basic job succeeded"):
        assert line in text, text
    assert "Per-step output vs the uninterrupted run: identical" in text
    assert "final parameters: identical" in text
    # The demo cleans up after itself: no cluster processes, no state left behind.
    assert not any((tmp_path / "home").glob("demo-cluster-*"))


@pytest.mark.slow
def test_distributed_demo_story(tmp_path: Path) -> None:
    tidal = Path(sys.executable).with_name("tidal")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    env.update(TIDAL_HOME=str(tmp_path / "home"), COLUMNS="120")
    out = subprocess.run([str(tidal), "demo", "--distributed"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())  # the story wraps at the terminal width
    for line in ("runs on two nodes", "Resized to 2 devices", "Rank 3 alone moved to node-2",
                 "Grown back to 4 devices", "Job succeeded"):
        assert line in text, text
    assert "Every rank's per-step output vs plain torchrun: identical; final parameters: identical" in text
    assert not any((tmp_path / "home").glob("demo-ddp-*"))
