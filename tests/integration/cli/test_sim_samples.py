"""`tidal sim` on the sample traces shipped with the package, as the README's examples run it: no trace files of
one's own needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIDAL = Path(sys.executable).parent / "tidal"


def test_the_readme_example_runs_on_the_shipped_sample(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    p = subprocess.run([str(TIDAL), "sim", "--trace", "sample:philly-week", "--cluster", "sample:philly-vc",
                        "--quota", "sample:philly-vc", "--limit", "400", "--policies", "fifo,singularity",
                        "--workers", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "400 jobs on 2816 devices" in p.stderr  # 352 nodes of 8 GPUs, the 11 VCs of philly-vc
    run = json.loads(out.read_text())
    given = run["input"]
    assert (given["trace"], given["cluster"], given["quota"]) == \
        ("sample:philly-week", "sample:philly-vc", "sample:philly-vc")
    assert (given["trace_jobs"], given["simulated_jobs"], given["capacity_devices"]) == (11386, 400, 2816)
    assert set(run["policies"]) == {"fifo", "singularity"}


def test_an_unknown_sample_is_a_clear_error(tmp_path: Path) -> None:
    p = subprocess.run([str(TIDAL), "sim", "--trace", "sample:helios", "--cluster", "8x8"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode != 0
    assert "error: no sample trace 'helios'" in p.stderr and "sample:philly-week" in p.stderr, p.stderr
