"""ingest_s3: the ingest job (benchmarks/ingest.py's workload, job and checks) fed from one
S3 origin by the loaders data-lake users run, each at its best documented configuration,
and by blobsdk.

``python -m benchmarks ingest_s3 [--quick] [--json FILE]``.

**The origin**: SeaweedFS (servers/seaweedd.py) behind servers/hddproxy.py, a striped store
of 3 disks x 60 MB/s = 180 MB/s, 4 MiB stripes, 2 spindles a disk, 5 ms a seek (one per
stripe a request touches): a request's stripes are read from their own disks in parallel,
so a loader's request size does not decide which share of the disks it meets.  The
physical limit of a cold epoch is the dataset's bytes / 180 MB/s (the job's compute is
sized to the same, 6.0 s an epoch at full size), of a warm epoch its compute.

**The rows** (benchmarks/_ingest_rows.py), each in a process spawned for it, the same job,
samples, checks and DataLoader settings (4 persistent workers, batch 8, torch's default
prefetch, one collate); every cache gets the same budget, the dataset + 256 MiB (what one
of blobsdk's L3 nodes is given; blobsdk keeps one replica per chunk):

- ``s3torch_sequential``, ``s3torch_range_based``: s3torchconnector's ``S3MapDataset``, one
  object per sample, with each of its two documented readers; no cache.
- ``litdata_NNmb``: litdata's ``StreamingDataset`` over chunks of 4, 8, 16 and 64 MB
  (``--quick``: 8 and 64), tuple samples ``(index, bytes)``, ``max_cache_size`` = the
  budget.  (With dict samples and more than one worker, litdata 0.2.76 fails in its first
  epoch: docs/benchmarks.md says where.)
- ``webdataset_NNmb``: WebDataset over tar shards of the same sizes, each shard one plain S3
  GET (boto3), shards shuffled and split over the workers; no cache.
- ``blobsdk_l3``, ``blobsdk_l2``: ``BlobIterableDataset`` (readahead 8) over a cluster whose
  L4 is the same bucket, with each of its two documented caches: 2 L3 nodes (a region's
  shared flash, a prefetch window of 16 into it), or L2 (the host's local flash, a
  directory its DataLoader workers share; no L3 nodes, no deep prefetch: the readahead's
  reads fill it behind them).  blobsdk's best of the two is its figure, as each peer's.
- ``mosaic_NNmb``: Mosaic Streaming's ``StreamingDataset`` over MDS shards of the same sizes,
  ``cache_limit`` = the budget, in the interpreter of its own venv (``make venv-mosaic``:
  mosaicml-streaming 0.13.0 pins numpy < 2.2 and xxhash < 4; benchmarks/_ingest_mosaic.py);
  without that venv, reported as skipped.

**Two orders**: every row once, blobsdk's first (they used to hang the forked workers of the
loaders after them when they ran in the same process), then each peer's best configuration
and blobsdk's best again in the reverse order.  ``order_spread``: the largest change of a row's job
time between its two runs, as a share.  Each peer's best is the configuration with the
least ingestion time (stall) over the job, the mean of its runs.

**Figures** per row: each epoch's wall time, its stall, the time to the first batch
(``ttfb_s``, from the loader's start), the bytes it pulled from the origin (``tier_mb``).
Ratios (blobsdk's figure, at its best configuration, against the best peer's figure, each
figure's own best peer):
``cold_vs_best_peer`` (epoch 0's stall, goal >= 1.3), ``warm_vs_best_peer`` (the later
epochs' stall), ``job_vs_best_peer`` (the job's stall, goal >= 2), ``ttfb_vs_best_peer``
(goal >= 1: no later than the best).  Against the physical limit: ``cold_vs_limit`` (the
limit / blobsdk's epoch 0 wall time, goal >= 0.9), ``warm_vs_limit``, ``job_vs_limit``;
each peer's best has its own ``_vs_limit`` figures.  The measured floor: before the rows,
16 threads of plain boto3 GETs read every sample object once through the proxy, no loader,
no job (``origin_ceiling_mbps``: what this machine's cores get from the model);
``cold_vs_ceiling`` is the dataset at that rate / blobsdk's epoch 0 wall time.
"""

from __future__ import annotations

import asyncio
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from blobsdk.config import L2Config
from servers.cluster import start_cluster

from . import _ingest_peers as peers
from . import _ingest_rows as rows
from ._ingest_job import JobResult
from ._ingest_rows import Row, RowContext
from ._ingest_workload import FULL, QUICK, MiB, Samples, Workload
from ._report import Report

GOALS = {
    "cold_vs_limit": ">= 0.9",
    "cold_vs_best_peer": ">= 1.3",
    "job_vs_best_peer": ">= 2",
    "ttfb_vs_best_peer": ">= 1",
}
CEILING_PARALLEL = 16


async def run(quick: bool = False) -> Report:
    return await measure(QUICK if quick else FULL, rows.sweep(quick, mosaic=rows.mosaic_python() is not None))


async def measure(workload: Workload, sweep: list[Row]) -> Report:
    """Every row of ``sweep`` (none without the ``bench`` extra), and blobsdk; then each
    peer's best and blobsdk again, in the reverse order."""
    samples = Samples(workload)
    model = peers.hdd_model(workload)
    say("== ingest_s3: parameters ==", *workload.describe(samples), f"origin = {model.describe()}")
    why = peers.missing()
    sweep = [] if why else sweep
    with tempfile.TemporaryDirectory(prefix="bench-ingest-s3-") as tmp:
        root = Path(tmp)
        with peers.start_origin(root / "origin", workload) as origin, peers.aws_env():
            sizes = sorted({row.chunk_mb for row in sweep if row.chunk_mb})
            shards = peers.load(origin, samples, root, litdata_mb=sizes if sweep else (), webdataset_mb=sizes)
            load_mosaic(origin, workload, root, sorted({row.chunk_mb for row in sweep if row.peer == "mosaic"}))
            context = RowContext(workload, origin.endpoint, root, cache_budget(samples), root / "blobsdk.toml", shards)
            say("== rows ==", *(f"{row.name}: {row.describe(context)}" for row in [*rows.BLOBSDK_ROWS, *sweep]))
            ceiling = await asyncio.to_thread(origin_ceiling_Bps, origin, samples)
            say(f"origin ceiling: {ceiling / 1e6:.0f} MB/s ({CEILING_PARALLEL} plain GETs in flight, every sample once)")
            first = {}
            for row in rows.BLOBSDK_ROWS:
                first.update(await blobsdk_row(origin, context, samples, row))
            ours = min(first, key=lambda name: first[name].ingest_s)
            more, failed = await asyncio.to_thread(rows.play_rows, sweep, context, origin.proxy.stats, say, origin.proxy.timeline)
            first.update(more)
            picks = best_configs(first, sweep)
            say("== again, best of each peer, in the reverse order ==")
            again_rows = list(reversed([row for row in sweep if row.name in picks.values()]))
            proxy = origin.proxy
            again, failed_again = await asyncio.to_thread(rows.play_rows, again_rows, context, proxy.stats, say, proxy.timeline)
            again.update(await blobsdk_row(origin, context, samples, next(r for r in rows.BLOBSDK_ROWS if r.name == ours)))
    skipped = dict.fromkeys(rows.PEERS, why) if why else {}
    if not any(row.peer == "mosaic" for row in sweep):
        skipped["mosaic"] = f"not run: no {rows.MOSAIC_VENV.name} (make venv-mosaic: mosaicml-streaming 0.13.0 pins numpy < 2.2)"
    out = report(workload, samples, first, again, picks, {**failed, **failed_again}, skipped, ours=ours)
    out.metrics["origin_ceiling_mbps"] = ceiling / 1e6
    if ours in first:
        runs = [r for r in (first[ours], again.get(ours)) if r is not None]
        out.metrics["cold_vs_ceiling"] = _mean(runs, lambda r: samples.total_bytes / ceiling / r.epochs[0].wall_s)
    return out


def origin_ceiling_Bps(origin: peers.Origin, samples: Samples) -> float:
    """What this machine gets from the origin with no loader: every sample object read once
    by ``CEILING_PARALLEL`` threads of plain boto3 GETs through the proxy, bytes / second.
    The cold epoch's measured floor is the dataset over it."""
    client = origin.boto3(origin.endpoint)

    def get(i: int) -> int:
        return len(client.get_object(Bucket=peers.BUCKET, Key=f"{peers.OBJECTS}{i:06d}")["Body"].read())

    begun = time.perf_counter()
    with ThreadPoolExecutor(CEILING_PARALLEL) as pool:
        moved = sum(pool.map(get, range(len(samples))))
    return moved / (time.perf_counter() - begun)


async def blobsdk_row(origin: peers.Origin, context: RowContext, samples: Samples, row: Row) -> dict[str, JobResult]:
    """A blobsdk row on a fresh cluster and an empty cache (a cold first epoch): its L3 nodes
    (``row.reader`` "l3"), or a new L2 directory of the budget's size ("l2"); the client's
    config is written to ``context.blobsdk_toml`` for the row's process."""
    options = peers.blobsdk_cluster_options(origin, context.workload, samples, row.reader)
    async with start_cluster(Path(tempfile.mkdtemp(prefix="cluster-", dir=context.root)), **options) as cluster:
        assert cluster.config is not None and context.blobsdk_toml is not None
        await peers.load_blobs(cluster.config, origin, samples)
        config = cluster.config
        if row.reader == "l2":
            l2 = L2Config(dir=tempfile.mkdtemp(prefix="l2-", dir=context.root), capacity_bytes=context.cache_bytes)
            config = msgspec.structs.replace(config, l2=l2)
        context.blobsdk_toml.write_text(config.to_toml())
        results, _ = await asyncio.to_thread(rows.play_rows, [row], context, origin.proxy.stats, say, origin.proxy.timeline)
    return results


def load_mosaic(origin: peers.Origin, workload: Workload, root: Path, sizes_mb: list[int]) -> None:
    """Mosaic's MDS shards at each size, written in its venv, uploaded to ``mosaic-NNmb/``."""
    if not sizes_mb:
        return
    spec, out = root / "workload.pkl", root / "mosaic-build"
    spec.write_bytes(pickle.dumps(workload))
    rows.run_mosaic("write", str(spec), str(out), *map(str, sizes_mb))
    for mb in sizes_mb:
        shards = out / peers.mosaic_dir(mb)
        origin.upload((f"{peers.mosaic_dir(mb)}/{path.name}", path) for path in sorted(shards.iterdir()))
    shutil.rmtree(out, ignore_errors=True)


def cache_budget(samples: Samples) -> int:
    """Every cache's budget: the dataset + 256 MiB, as one L3 node is given."""
    return samples.total_bytes + 256 * MiB


def best_configs(results: dict[str, JobResult], sweep: list[Row]) -> dict[str, str]:
    """Each peer's configuration with the least ingestion time (peer -> row name)."""
    picks: dict[str, str] = {}
    for peer in rows.PEERS:
        ran = [row.name for row in sweep if row.peer == peer and row.name in results]
        if ran:
            picks[peer] = min(ran, key=lambda name: results[name].ingest_s)
    return picks


def report(
    workload: Workload,
    samples: Samples,
    first: dict[str, JobResult],
    again: dict[str, JobResult],
    picks: dict[str, str],
    failed: dict[str, str],
    skipped: dict[str, str],
    ours: str = "blobsdk",
) -> Report:
    """The rows' figures, and blobsdk's (row ``ours``, its best configuration) against each
    figure's best peer and the limit."""
    out = Report("ingest_s3")
    floor = samples.total_bytes / workload.hdd_bandwidth_Bps
    out.metrics["cold_limit_s"] = floor
    for name, result in first.items():
        row_metrics(out, name, result, floor)
    spreads = []
    for name, result in again.items():
        row_metrics(out, f"{name}_again", result, floor)
        one, two = sum(e.wall_s for e in first[name].epochs), sum(e.wall_s for e in result.epochs)
        spreads.append(abs(two - one) / one)
    if spreads:
        out.metrics["order_spread"] = max(spreads)
    both = {name: [r for r in (first.get(name), again.get(name)) if r is not None] for name in [*picks.values(), ours]}
    for peer, name in picks.items():
        out.details[f"best_{peer}"] = name
    if ours in first:
        out.details["best_blobsdk"] = ours
        runs = both[ours]
        limits(out, "", runs, floor)
        for peer, name in picks.items():
            limits(out, f"{peer}_best_", both[name], floor)
        if picks:
            best_peers = [both[name] for name in picks.values()]
            ratio(out, "cold_vs_best_peer", best_peers, runs, lambda r: r.epochs[0].stall_s)
            ratio(out, "warm_vs_best_peer", best_peers, runs, lambda r: sum(e.stall_s for e in r.epochs[1:]))
            ratio(out, "job_vs_best_peer", best_peers, runs, lambda r: r.ingest_s)
            ratio(out, "ttfb_vs_best_peer", best_peers, runs, lambda r: r.extra["ttfb_s"])
    out.skipped.update(failed)
    out.skipped.update(skipped)
    out.goals.update({key: goal for key, goal in GOALS.items() if key in out.ratios or key in out.metrics})
    return out


def row_metrics(out: Report, name: str, result: JobResult, floor: float) -> None:
    for e, timing in enumerate(result.epochs):
        out.metrics[f"{name}_epoch{e}_s"] = timing.wall_s
        out.metrics[f"{name}_stall_epoch{e}_s"] = timing.stall_s
    out.metrics[f"{name}_ingest_s"] = result.ingest_s
    for key in ("ttfb_s", "tier_mb", "tier_requests", "origin_first_s", "origin_last_s", "origin_cold_mbps", "drain_s"):
        if key in result.extra:
            out.metrics[f"{name}_{key}"] = result.extra[key]


def _mean(runs: list[JobResult], figure: Callable[[JobResult], float]) -> float:
    return statistics.fmean(figure(r) for r in runs)


def limits(out: Report, prefix: str, runs: list[JobResult], floor: float) -> None:
    """Against the physical limit (the mean of the row's runs): a cold epoch's is the
    origin's time for the dataset or the compute, the longer; a warm epoch's its compute."""
    cold = _mean(runs, lambda r: max(floor, r.epochs[0].compute_s) / r.epochs[0].wall_s)
    warm = _mean(runs, lambda r: sum(e.compute_s for e in r.epochs[1:]) / sum(e.wall_s for e in r.epochs[1:]))
    job = _mean(
        runs,
        lambda r: (max(floor, r.epochs[0].compute_s) + sum(e.compute_s for e in r.epochs[1:])) / sum(e.wall_s for e in r.epochs),
    )
    out.metrics[f"{prefix}cold_vs_limit"] = cold
    out.metrics[f"{prefix}warm_vs_limit"] = warm
    out.metrics[f"{prefix}job_vs_limit"] = job


def ratio(
    out: Report, key: str, peers_runs: list[list[JobResult]], ours: list[JobResult], figure: Callable[[JobResult], float]
) -> None:
    """The best peer's figure / ours (each the mean of its runs); ``_lo``/``_hi``: over the
    pairs of single runs."""
    best = min(_mean(runs, figure) for runs in peers_runs)
    out.ratios[key] = best / max(_mean(ours, figure), 1e-3)
    best_runs = min(peers_runs, key=lambda runs: _mean(runs, figure))
    pairs = [figure(p) / max(figure(o), 1e-3) for p in best_runs for o in ours]
    out.metrics[f"{key}_lo"], out.metrics[f"{key}_hi"] = min(pairs), max(pairs)


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)
    sys.stdout.flush()
