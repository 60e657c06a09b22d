"""The ingest benchmark's pieces at a tiny size (benchmarks/ingest.py): every variant feeds
the job the dataset's bytes against a real cluster, and the job's accounting and checks."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import _picture, ingest
from benchmarks._ingest_job import Batch, JobClock, JobResult, WallClock, WrongData, run_job
from benchmarks._ingest_variants import WithL3Traffic
from benchmarks._ingest_workload import KiB, MiB, Samples, Workload, sample_sizes
from benchmarks._report import Report
from servers.cluster import start_cluster

TINY = Workload(
    dataset_bytes=2 * MiB,
    sample_min=64 * KiB,
    sample_max=256 * KiB,
    epochs=2,
    batch_size=4,
    block_servers=2,
    latency_ms=1.0,
    bandwidth_mbps=400.0,
    l3_nodes=1,
    workers=2,
    copy_parallel=4,
    readahead=4,
    prefetch_window=4,  # each worker has ~6 samples: its second window is prefetched
    into_pairs=1,
)
INTO = ("into_vs_map", "into_vs_map_workers_cpu")


def test_every_variant_feeds_the_job_every_sample_each_epoch(tmp_path: Path) -> None:
    samples = Samples(TINY)
    with start_cluster(tmp_path / "cluster", **ingest.cluster_options(TINY, samples)) as cluster:
        assert cluster.config is not None
        urls = asyncio.run(ingest.load(cluster.config, samples))
        results, played = {}, []
        for make in ingest.variants(cluster.config, urls, samples, TINY, tmp_path):
            variant = make()
            results[variant.name] = ingest.play(variant, TINY, samples)  # WrongData if a byte or sample is off
            played.append(variant)
    rows = ["memory", "naive", "dataloader", "copy", "fsspec", "blobsdk", "blobsdk_map", "blobsdk_into", "memory_l3_busy"]
    assert list(results) == rows
    traffic = played[-1]
    assert isinstance(traffic, WithL3Traffic)
    assert traffic._reader.returncode is not None  # the background reader stopped with its variant
    assert all(len(r.epochs) == TINY.epochs and 0 < r.utilisation <= 1 for r in results.values())
    assert results["copy"].extra["download_s"] > 0
    assert all(results[name].extra["ttfb_s"] > 0 for name in ("memory", "dataloader", "blobsdk"))  # from the loader's start
    assert multiprocessing.active_children() == []  # every loader's workers stopped
    assert not (tmp_path / "copy").exists() and not (tmp_path / "fsspec-cache").exists()
    report = ingest.report(results)
    assert set(report.ratios) == {"ingest_vs_naive", "ingest_vs_dataloader", "ingest_vs_copy", "ingest_vs_fsspec", *INTO}
    assert report.metrics["into_vs_map_lo"] == report.ratios["into_vs_map"] == report.metrics["into_vs_map_hi"]
    assert all(results[name].extra["workers_cpu_s"] > 0 for name in ("dataloader", "blobsdk", "blobsdk_map", "blobsdk_into"))
    assert results["naive"].extra["workers_cpu_s"] == 0
    assert report.metrics["utilisation"] == results["blobsdk"].utilisation
    assert set(report.goals) == {*report.ratios, "utilisation"} - set(INTO)


def test_each_sample_has_its_own_block_url_with_its_bytes(tmp_path: Path) -> None:
    samples = Samples(TINY)
    with start_cluster(tmp_path / "cluster", **ingest.cluster_options(TINY, samples)) as cluster:
        assert cluster.config is not None
        urls = asyncio.run(ingest.load(cluster.config, samples))
        import requests

        with requests.Session() as http:
            bodies = [http.get(url, timeout=30).content for url in urls]
    assert [len(b) for b in bodies] == samples.sizes
    assert all(b == samples.data(i) for i, b in enumerate(bodies))


class VirtualClock:
    """A job clock that moves only when the job sleeps."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class _Replay:
    """A variant that hands out the samples from memory, in order, optionally spoiled."""

    name = "replay"

    def __init__(
        self, samples: Samples, *, flip: bool = False, drop: bool = False, prepare_s: float = 0.0, clock: JobClock | None = None
    ) -> None:
        self.samples, self.flip, self.drop, self.prepare_s = samples, flip, drop, prepare_s
        self.clock = clock or WallClock()

    def prepare(self) -> None:
        self.clock.sleep(self.prepare_s)

    def epoch(self, epoch: int) -> Iterable[Batch]:
        keys = list(range(len(self.samples)))[: -1 if self.drop else None]
        for start in range(0, len(keys), 4):
            chunk = keys[start : start + 4]
            data = np.concatenate([np.frombuffer(self.samples.data(i), dtype=np.uint8) for i in chunk])
            if self.flip:
                data[0] ^= 1
            yield Batch(keys=chunk, sizes=[self.samples.sizes[i] for i in chunk], data=data)

    def figures(self) -> dict[str, float]:
        return {"replayed": 1.0}

    def close(self) -> None:
        pass


def test_wrong_bytes_void_the_run() -> None:
    samples = Samples(TINY)
    with pytest.raises(WrongData, match=r"sample 0: wrong bytes"):
        run_job(_Replay(samples, flip=True), TINY, samples)


def test_a_missing_sample_voids_the_run() -> None:
    samples = Samples(TINY)
    with pytest.raises(WrongData, match=rf"epoch 0: {len(samples) - 1} of {len(samples)} samples, 0 more than once"):
        run_job(_Replay(samples, drop=True), TINY, samples)


def test_preparation_that_outlasts_the_setup_phase_is_ingestion() -> None:
    slow_tier = replace(TINY, bandwidth_mbps=20.0)  # ~0.05 s of compute per epoch, set-up ~5 ms
    samples, clock = Samples(slow_tier), VirtualClock()  # time passes only in sleeps: exact figures
    result = run_job(_Replay(samples, prepare_s=0.3, clock=clock), slow_tier, samples, clock)
    assert result.epochs[0].stall_s == pytest.approx(0.3 - result.setup_s)  # the preparation past the set-up phase
    assert result.epochs[1].stall_s == 0.0  # from memory: no stall
    assert result.compute_s == pytest.approx(slow_tier.epochs * slow_tier.epoch_compute_s(samples))
    assert result.ingest_s == pytest.approx(sum(e.stall_s for e in result.epochs))
    assert result.utilisation == pytest.approx(result.compute_s / (result.compute_s + result.ingest_s))
    assert result.extra == {"replayed": 1.0}


def test_sample_sizes_are_log_uniform_within_bounds_and_reach_the_dataset_size() -> None:
    sizes = sample_sizes(replace(TINY, dataset_bytes=64 * MiB))
    assert sum(sizes) >= 64 * MiB > sum(sizes[:-1])
    assert all(64 * KiB <= s <= 256 * KiB for s in sizes)
    assert sizes == sample_sizes(replace(TINY, dataset_bytes=64 * MiB))  # deterministic
    small = sum(s < 128 * KiB for s in sizes) / len(sizes)
    assert 0.4 < small < 0.6  # half the sizes below the geometric middle of the range


def test_sample_bounds_must_be_ordered_and_positive() -> None:
    with pytest.raises(ValueError, match=r"^need 0 < sample_min <= sample_max, got 2048 and 1024$"):
        sample_sizes(replace(TINY, sample_min=2048, sample_max=1024))


def test_samples_are_spread_over_the_block_servers_by_bytes() -> None:
    sizes = sample_sizes(replace(TINY, dataset_bytes=16 * MiB))
    homes = ingest.balanced_homes(sizes, 3)
    loads = [sum(s for s, h in zip(sizes, homes, strict=True) if h == server) for server in range(3)]
    assert max(loads) - min(loads) <= max(sizes)


def test_the_report_names_the_issue_figures() -> None:
    def job(ingest_s: float) -> JobResult:
        from benchmarks._ingest_job import EpochTiming

        return JobResult(setup_s=0.1, epochs=[EpochTiming(wall_s=1.0 + ingest_s, compute_s=1.0, first_batch_s=0.0)])

    results = {"memory": job(0.1), "naive": job(30), "dataloader": job(10), "copy": job(4), "fsspec": job(6), "blobsdk": job(2)}
    report = ingest.report(results)
    assert report.ratios == {"ingest_vs_naive": 15, "ingest_vs_dataloader": 5, "ingest_vs_copy": 2, "ingest_vs_fsspec": 3}
    assert report.metrics["utilisation"] == pytest.approx(1 / 3)
    assert report.metrics["copy_stall_epoch0_s"] == pytest.approx(4)


def _blocks() -> dict[str, JobResult]:
    from benchmarks._ingest_job import EpochTiming

    job = JobResult(setup_s=0.1, epochs=[EpochTiming(wall_s=2.0, compute_s=1.0, first_batch_s=0.0)])
    return dict.fromkeys(("memory", "naive", "dataloader", "copy", "fsspec", "blobsdk"), job)


@pytest.mark.skipif(_picture.missing() is not None, reason=str(_picture.missing()))
def test_the_picture_is_a_png_of_every_row(tmp_path: Path) -> None:
    from benchmarks._ingest_job import EpochTiming

    def job(wait: float) -> JobResult:
        return JobResult(setup_s=0.1, epochs=[EpochTiming(1.0 + wait, 1.0, wait, (wait, 0.0, 0.01))] * 3)

    report = Report("ingest")
    ingest.picture(report, {"blobsdk_s3": job(0.5), "s3torch": job(3.0)}, tmp_path / "out" / "ingest.png", TINY)
    assert (tmp_path / "out" / "ingest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.details["png"] == str(tmp_path / "out" / "ingest.png")


def test_the_picture_goes_next_to_the_json_unless_named() -> None:
    import argparse

    assert ingest.options(argparse.Namespace(png=None, json=None)) == {"png": Path("ingest.png")}
    assert ingest.options(argparse.Namespace(png=None, json=Path("out/run.json"))) == {"png": Path("out/run.png")}
    assert ingest.options(argparse.Namespace(png=Path("p.png"), json=Path("run.json"))) == {"png": Path("p.png")}


def test_rows_that_could_not_run_are_reported_as_skipped_not_failed() -> None:
    import io

    report = ingest.report(_blocks(), {"s3torch": "s3torchconnector not installed (pip install blobsdk[bench])"})
    out = io.StringIO()
    report.print_table(out)
    assert "  skip   s3torch                                 -   s3torchconnector not installed" in out.getvalue()
    assert not report.failed


def test_the_picture_option_is_the_ingest_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit):
        main(["put_get", "--png", "x.png"])
    assert capsys.readouterr().err.endswith("error: --png is for the ingest, scale, swarm_sim, membership benchmarks\n")
