"""The s3_read benchmark (benchmarks/s3_read.py) at a tiny size: it starts SeaweedFS and
Redis, reads the same ranges (and whole ~323 KB objects, benchmarks/_s3_objects.py) through
every row, checks every byte and reports each row against obstore (the objects against
the best of obstore, boto3 and s3torchconnector); no figure is asserted (those are the
benchmark's)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import _s3_rows, s3_read
from benchmarks.s3_read import KiB, MiB, Shape

TINY = Shape(objects=2, object_bytes=1 * MiB, rounds=2, pass_bytes={256 * KiB: 1 * MiB, 64 * KiB: 512 * KiB}, small_objects=4)
ROWS = ("obstore", "boto3", "getter", "store", "client")
OBJECT_ROWS = ("obstore", "boto3", "s3torch", "store", "client", "client_put", "obstore_put")


def test_every_row_reads_the_same_ranges_and_is_reported_against_obstore() -> None:
    report = asyncio.run(s3_read.measure(TINY))
    assert not report.failed
    labels = ("256KiB", "64KiB")
    assert set(report.metrics) == {
        *(f"{row}_{what}_{label}" for row in ROWS for what in ("MBps", "cpu_s_per_GB") for label in labels),
        *(f"{row}_{what}_323KB" for row in OBJECT_ROWS for what in ("objps", "cpu_s_per_GB")),
        *(f"seaweed_cpu_s_per_GB_{label}" for label in (*labels, "323KB")),
        "floor_cpu_s_per_GB",
    }
    assert all(value > 0 for value in report.metrics.values())
    ratios = {f"{row}_vs_obstore_{label}" for row in ROWS[1:] for label in labels}
    ours = ("store", "client", "client_put")
    ratios |= {f"{row}_vs_{peer}_323KB" for row in ours for peer in ("best", "obstore", "boto3", "s3torch")}
    ratios.add("client_put_vs_obstore_put_323KB")
    floors = {f"client_cpu_vs_floor_{label}" for label in labels}
    assert set(report.ratios) == {f"{r}{end}" for r in ratios for end in ("", "_min", "_max")} | floors
    for ratio in ratios:
        assert report.ratios[f"{ratio}_min"] <= report.ratios[ratio] <= report.ratios[f"{ratio}_max"]
    goals = {f"store_vs_obstore_{label}": ">= 0.9" for label in labels} | dict.fromkeys(floors, "<= 1.5")
    assert report.goals == goals | {f"{row}_vs_best_323KB": ">= 1.0" for row in ("store", "client")}
    for row in ours:  # the best peer of a round is at least as fast as each peer
        assert all(report.ratios[f"{row}_vs_best_323KB"] <= report.ratios[f"{row}_vs_{p}_323KB"] for p in ("obstore", "boto3"))
    details = {"concurrency": 8, "objects": 2, "object_bytes": MiB, "rounds": 2, "small_objects": 4}
    assert report.details == details


def test_a_wrong_byte_stops_the_run() -> None:
    with pytest.raises(AssertionError, match=r"^boto3: range 7 came back with the wrong bytes$"):
        _s3_rows.check(False, "boto3", 7)
