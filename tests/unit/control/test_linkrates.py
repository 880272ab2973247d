"""The measured link between two regions (control/linkrates.py): which copies are timed, which are kept, and
the rate they give."""

from __future__ import annotations

from tidal.control.linkrates import KEEP, MIN_BYTES, kept, rate_gbps, timed

GB = 1_000_000_000


def test_only_copies_of_64_MiB_or_more_are_timed() -> None:
    assert MIN_BYTES == 64 * 1024 * 1024
    assert timed(MIN_BYTES, 1.0)
    assert not timed(MIN_BYTES - 1, 1.0)  # mostly requests: says little of the link
    assert not timed(GB, 0.0)  # a copy reported without its time
    assert kept([], MIN_BYTES - 1, 0.001) == []
    assert kept([[GB, 2.0]], 5 << 20, 1.5) == [[GB, 2.0]]


def test_the_last_five_copies_are_kept_oldest_first() -> None:
    assert KEEP == 5
    samples: list[list[float]] = []
    for i in range(1, 8):
        samples = kept(samples, i * GB, 1.0)
    assert samples == [[3 * GB, 1.0], [4 * GB, 1.0], [5 * GB, 1.0], [6 * GB, 1.0], [7 * GB, 1.0]]


def test_the_rate_is_the_median_of_the_copies_rates() -> None:
    assert rate_gbps([]) is None
    assert rate_gbps([[GB, 2.0]]) == 0.5
    assert rate_gbps([[GB, 2.0], [GB, 1.0]]) == 0.75  # an even count: the mean of the middle two
    # One copy slowed (the link shared, a store's retries) or one unusually fast moves the median not at all.
    assert rate_gbps([[GB, 4.0], [GB, 4.0], [GB, 100.0], [GB, 4.0], [GB, 0.01]]) == 0.25
    # A lasting change of the link shows within three copies.
    samples = [[GB, 4.0]] * 5
    for _ in range(2):
        samples = kept(samples, GB, 1.0)
    assert rate_gbps(samples) == 0.25
    samples = kept(samples, GB, 1.0)
    assert rate_gbps(samples) == 1.0
    # Copies of different sizes count alike: their rates, not their bytes, are what the median is of.
    assert rate_gbps([[100 * GB, 100.0], [MIN_BYTES, MIN_BYTES / GB / 3], [GB, 0.5]]) == 2.0
