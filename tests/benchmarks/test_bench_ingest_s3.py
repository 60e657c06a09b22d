"""The fair S3 ingest benchmark (benchmarks/ingest_s3.py) at a tiny size: every row, each in
its own spawned process, feeds the job every sample through the HDD proxy, in two orders;
and its report's arithmetic, on made-up timings."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import pytest

from benchmarks import _ingest_peers as peers
from benchmarks import _ingest_rows as rows
from benchmarks import ingest_s3
from benchmarks._ingest_job import EpochTiming, JobResult
from benchmarks._ingest_rows import Row
from benchmarks._ingest_workload import KiB, MiB, Samples, Workload

TINY = Workload(
    dataset_bytes=6 * MiB,
    sample_min=64 * KiB,
    sample_max=512 * KiB,
    epochs=2,
    batch_size=4,
    block_servers=2,
    latency_ms=1.0,
    bandwidth_mbps=400.0,
    l3_nodes=1,
    workers=2,
    readahead=4,
    prefetch_window=4,
)
SWEEP = [Row("s3torch", reader="range_based"), Row("litdata", chunk_mb=1), Row("webdataset", chunk_mb=1)]


def test_every_row_feeds_the_job_every_sample_in_its_own_process_in_two_orders(tmp_path: Path) -> None:
    """Run from a process that has used obstore (earlier tests): each row is spawned, so
    none inherits it; blobsdk's two caches first, then the peers, then the peers reversed and
    blobsdk's best."""
    report = asyncio.run(ingest_s3.measure(TINY, SWEEP))
    assert multiprocessing.active_children() == []  # every row's process and workers stopped
    ours = report.details["best_blobsdk"]
    (other,) = {"blobsdk_l3", "blobsdk_l2"} - {ours}  # played once: only the best plays again
    names = ["blobsdk_l3", "blobsdk_l2"] + ([row.name for row in SWEEP] if peers.missing() is None else [])
    for name in names:  # WrongData (a row's failure) would have made it a skip
        assert report.metrics[f"{name}_tier_mb"] > 0  # through the proxy
        assert report.metrics[f"{name}_ttfb_s"] > 0
        assert (f"{name}_again_epoch1_s" in report.metrics) == (name != other)  # the second order
        assert 0 <= report.metrics[f"{name}_origin_first_s"] < report.metrics[f"{name}_origin_last_s"]  # the proxy's timeline
    assert report.metrics["cold_limit_s"] == pytest.approx(Samples(TINY).total_bytes / (2 * 400e6))
    assert report.skipped["mosaic"].startswith("not run: no .venv-mosaic (make venv-mosaic")
    if peers.missing() is None:
        assert {k: v for k, v in report.skipped.items() if k != "mosaic"} == {}
        assert set(report.ratios) == {"cold_vs_best_peer", "warm_vs_best_peer", "job_vs_best_peer", "ttfb_vs_best_peer"}
        assert {report.details[f"best_{row.peer}"] for row in SWEEP} == {row.name for row in SWEEP}


@pytest.mark.skipif(rows.mosaic_python() is None, reason="no .venv-mosaic (make venv-mosaic)")
def test_mosaic_streaming_rows_run_in_the_interpreter_of_its_own_venv() -> None:
    report = asyncio.run(ingest_s3.measure(TINY, [Row("mosaic", chunk_mb=1)]))
    assert "mosaic" not in report.skipped
    assert report.metrics["mosaic_1mb_tier_mb"] > 0 and "mosaic_1mb_again_epoch1_s" in report.metrics
    assert report.details["best_mosaic"] == "mosaic_1mb"


def test_the_sweep_tries_every_documented_knob_and_quick_fewer_sizes() -> None:
    full, quick = rows.sweep(quick=False), rows.sweep(quick=True)
    assert [row.name for row in full] == [
        "s3torch_sequential",
        "s3torch_range_based",
        *(f"litdata_{mb}mb" for mb in (4, 8, 16, 64)),
        *(f"webdataset_{mb}mb" for mb in (4, 8, 16, 64)),
    ]
    assert [row.name for row in quick] == [
        "s3torch_sequential",
        "s3torch_range_based",
        "litdata_8mb",
        "litdata_64mb",
        "webdataset_8mb",
        "webdataset_64mb",
    ]
    assert [row.name for row in rows.sweep(quick=True, mosaic=True)][-2:] == ["mosaic_8mb", "mosaic_64mb"]


def _job(stalls: list[float], ttfb: float, compute: float = 1.0) -> JobResult:
    epochs = [EpochTiming(wall_s=compute + stall, compute_s=compute, first_batch_s=0.0) for stall in stalls]
    return JobResult(setup_s=0.1, epochs=epochs, extra={"ttfb_s": ttfb, "tier_mb": 10.0, "tier_requests": 3})


def test_the_report_puts_blobsdk_against_each_figures_best_peer_and_the_limit() -> None:
    workload = Workload(dataset_bytes=MiB, block_servers=1, bandwidth_mbps=1.0, epochs=3)
    samples = Samples(workload)
    floor = samples.total_bytes / 1e6
    ours = _job([1.0, 0.2, 0.2], ttfb=0.5, compute=floor)
    fast_cold = _job([2.0, 2.0, 2.0], ttfb=0.4, compute=floor)  # best cold, best time to first batch
    fast_warm = _job([3.0, 0.1, 0.1], ttfb=1.0, compute=floor)  # best warm
    first = {"blobsdk": ours, "s3torch_sequential": fast_cold, "litdata_8mb": fast_warm}
    again = {"blobsdk": ours, "s3torch_sequential": fast_cold, "litdata_8mb": fast_warm}
    picks = {"s3torch": "s3torch_sequential", "litdata": "litdata_8mb"}
    out = ingest_s3.report(workload, samples, first, again, picks, {}, {})
    assert out.ratios["cold_vs_best_peer"] == pytest.approx(2.0)
    assert out.ratios["warm_vs_best_peer"] == pytest.approx(0.2 / 0.4)
    assert out.ratios["job_vs_best_peer"] == pytest.approx(min(6.0, 3.2) / 1.4)
    assert out.ratios["ttfb_vs_best_peer"] == pytest.approx(0.4 / 0.5)
    assert out.metrics["cold_vs_limit"] == pytest.approx(floor / (floor + 1.0))
    assert out.metrics["warm_vs_limit"] == pytest.approx(2 * floor / (2 * floor + 0.4))
    assert out.metrics["order_spread"] == 0.0
    assert out.details == {"best_s3torch": "s3torch_sequential", "best_litdata": "litdata_8mb", "best_blobsdk": "blobsdk"}
    assert out.goals["cold_vs_limit"] == ">= 0.9" and out.goals["job_vs_best_peer"] == ">= 2"


def test_each_peer_is_picked_at_its_least_ingestion() -> None:
    results = {"litdata_8mb": _job([3.0], 1.0), "litdata_64mb": _job([1.0], 1.0), "s3torch_sequential": _job([2.0], 1.0)}
    sweep = [Row("litdata", chunk_mb=8), Row("litdata", chunk_mb=64), Row("s3torch", reader="sequential")]
    assert ingest_s3.best_configs(results, sweep) == {"litdata": "litdata_64mb", "s3torch": "s3torch_sequential"}


def test_the_cold_epoch_is_split_at_the_origins_first_and_last_byte() -> None:
    """``cold_origin``: the origin's requests begun before epoch 0's end (job start 100 s,
    set-up 0.5 s, epoch 0 of 4 s: until 104.5 s), against the job's own times."""
    epoch0 = EpochTiming(wall_s=4.0, compute_s=3.0, first_batch_s=0.1)
    result = JobResult(setup_s=0.5, epochs=[epoch0], extra={"started_at": 100.0})
    requests = [(100.25, 101.0, 2_000_000), (100.5, 104.25, 6_000_000), (104.6, 105.0, 9_000_000)]  # the last: epoch 1's
    figures = rows.cold_origin(result, requests)
    assert figures == pytest.approx({"origin_first_s": 0.25, "origin_last_s": 4.25, "origin_cold_mbps": 2.0, "drain_s": 0.25})
    assert rows.cold_origin(result, requests[2:]) == {}  # no request in epoch 0: nothing to say
