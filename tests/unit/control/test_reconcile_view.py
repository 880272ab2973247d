"""What the live snapshot tells the policy of a job's image, for the cost of moving it (policy/spill.py)."""

from __future__ import annotations

import pytest

from tidal.control.reconcile import _image_gb


def test_a_jobs_image_is_its_ranks_memory_at_the_last_heartbeat() -> None:
    assert _image_gb(None, 2) is None  # no heartbeat yet: the policy's default
    assert _image_gb({"time": 1.0, "cpu_s": 0.0}, 2) is None
    assert _image_gb({"rss_bytes": 3e9}, 2) == pytest.approx(3.0)
    # On GPUs each rank's GPU memory is copied to the host and dumped with the rest.
    assert _image_gb({"rss_bytes": 3e9, "gpu_rank_bytes": 5e9}, 2) == pytest.approx(13.0)
