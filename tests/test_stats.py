"""The per-tier counters (blobsdk/stats.py): recent quantiles and the cumulative histogram."""

from __future__ import annotations

from blobsdk.stats import LATENCY_BUCKETS, LatencyHistogram, TierStats


def test_a_hit_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() -> None:
    stats = TierStats()
    for seconds in (0.0, 0.00005, 0.00006, 0.001, 10.0, 10.5):
        stats.hit(100, seconds)
    h = stats.histogram()
    assert h.bounds == LATENCY_BUCKETS
    assert len(h.counts) == len(LATENCY_BUCKETS) + 1
    at = {bound: n for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True) if n}
    assert at == {0.00005: 2, 0.0001: 1, 0.001: 1, 10.0: 1, float("inf"): 1}  # bounds are inclusive
    assert h.count == stats.hits == 6
    assert h.sum == sum((0.0, 0.00005, 0.00006, 0.001, 10.0, 10.5))


def test_the_histogram_keeps_every_hit_while_the_quantiles_keep_recent_ones() -> None:
    stats = TierStats()
    for _ in range(5000):
        stats.hit(1, 2.0)
    for _ in range(3000):
        stats.hit(1, 0.0001)
    assert stats.as_dict()["p99_ms"] == 0.1  # the window holds only the last fast hits
    h = stats.histogram()
    assert h.count == 8000
    assert h.counts[LATENCY_BUCKETS.index(2.5)] == 5000


def test_cumulative_counts_are_prometheus_le_buckets() -> None:
    h = LatencyHistogram((0.1, 1.0), (2, 0, 3), 7.5)
    assert h.cumulative() == [2, 2, 5]
    assert h.count == 5
