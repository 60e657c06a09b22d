"""The rows of the fair S3 ingest benchmark (benchmarks/ingest_s3.py): what each row is, the
sweep of every peer's documented knobs, and how a row is played: in a process of its own,
spawned (not forked) for it, so no row inherits another's threads, clients or start method
(a loader whose workers fork from a process where obstore already ran hangs).
"""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ._ingest_job import JobResult
from ._ingest_variants import LoaderVariant
from ._ingest_workload import Samples, Workload

ROW_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Row:
    """One configuration of one loader: ``peer`` (s3torch, litdata, webdataset, blobsdk) and
    the documented knob it was given (a reader, or a chunk or shard size in MB)."""

    peer: str
    reader: str = ""  # s3torch: sequential or range_based; blobsdk: its cache tier, l3 or l2
    chunk_mb: int = 0  # litdata's chunk_bytes, WebDataset's shard size

    @property
    def name(self) -> str:
        knob = self.reader or (f"{self.chunk_mb}mb" if self.chunk_mb else "")
        return f"{self.peer}_{knob}" if knob else self.peer

    def describe(self, context: RowContext) -> str:
        budget = f"{context.cache_bytes / 1e6:.0f} MB"
        return {
            "s3torch": f"S3MapDataset.from_prefix, one object per sample, reader_constructor=S3ReaderConstructor.{self.reader}()",
            "litdata": f"StreamingDataset, chunk_bytes={self.chunk_mb}MB, tuple samples, max_cache_size={budget}",
            "webdataset": f"WebDataset, {self.chunk_mb} MB tar shards, one plain S3 GET per shard, shards shuffled",
            "mosaic": f"streaming.StreamingDataset, {self.chunk_mb} MB MDS shards, shuffled, cache_limit={budget}",
            "blobsdk": {
                "l3": f"BlobIterableDataset(readahead, prefetch_window, prefetch_tier='l3'), 4 MiB chunks, L3 nodes ({budget})",
                "l2": f"BlobIterableDataset(readahead, prefetch_tier=None), 4 MiB chunks, L2 local flash ({budget}), no L3",
            }.get(self.reader, ""),
        }[self.peer]


@dataclass(frozen=True)
class RowContext:
    """What a row's process needs (picklable): the workload, the origin's endpoint (the HDD
    proxy), a scratch directory, blobsdk's client config (a TOML file), WebDataset's shard
    keys per shard size, and the cache budget every cache is given."""

    workload: Workload
    endpoint: str
    root: Path
    cache_bytes: int
    blobsdk_toml: Path | None = None
    shards: dict[int, list[str]] = field(default_factory=dict)


PEERS = ("s3torch", "litdata", "webdataset", "mosaic")
BLOBSDK_ROWS = (Row("blobsdk", reader="l3"), Row("blobsdk", reader="l2"))  # its caches: a region's L3 nodes, the host's L2
MOSAIC_VENV = Path(__file__).resolve().parents[1] / ".venv-mosaic"
FULL_SIZES_MB = (4, 8, 16, 64)
QUICK_SIZES_MB = (8, 64)


def sweep(quick: bool, mosaic: bool = False) -> list[Row]:
    """Every peer configuration to try: s3torchconnector's two readers, litdata's,
    WebDataset's and (``mosaic``: its venv is there) Mosaic Streaming's chunk (shard) sizes
    (``--quick``: 8 and 64 MB only)."""
    sizes = QUICK_SIZES_MB if quick else FULL_SIZES_MB
    rows = [Row("s3torch", reader=reader) for reader in ("sequential", "range_based")]
    rows += [Row("litdata", chunk_mb=mb) for mb in sizes]
    rows += [Row("webdataset", chunk_mb=mb) for mb in sizes]
    rows += [Row("mosaic", chunk_mb=mb) for mb in sizes] if mosaic else []
    return rows


def mosaic_python() -> Path | None:
    """The interpreter of Mosaic Streaming's venv (``make venv-mosaic``), if it is there."""
    python = MOSAIC_VENV / "bin" / "python"
    return python if python.exists() else None


def run_mosaic(*args: str) -> None:
    """``python -m benchmarks._ingest_mosaic ARGS`` in Mosaic's venv, from this checkout."""
    python = mosaic_python()
    assert python is not None
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([str(python), "-m", "benchmarks._ingest_mosaic", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])


def variant_of(row: Row, context: RowContext, samples: Samples) -> LoaderVariant:
    """The row's loader (in the row's own process)."""
    from . import _ingest_peers as peers

    workload = context.workload
    if row.peer == "s3torch":
        return peers.s3torch(context.endpoint, workload, row.reader, name=row.name)
    if row.peer == "litdata":
        cache = context.root / f"cache-{row.name}"
        return peers.litdata_streaming(context.endpoint, workload, cache, row.chunk_mb, context.cache_bytes, name=row.name)
    if row.peer == "webdataset":
        return peers.webdataset(context.endpoint, workload, context.shards[row.chunk_mb], name=row.name)
    if row.peer == "mosaic":
        cache = context.root / f"cache-{row.name}"
        return peers.mosaic(context.endpoint, workload, cache, row.chunk_mb, context.cache_bytes, name=row.name)
    if row.peer == "blobsdk":
        import blobsdk

        assert context.blobsdk_toml is not None
        return peers.blobsdk_s3(blobsdk.ClientConfig.from_toml(context.blobsdk_toml), samples, workload, name=row.name)
    raise ValueError(f"no loader {row.peer!r}")


def play_here(row: Row, context: RowContext) -> JobResult:
    """Play the row in this process (a spawned one): make the samples, run the job.  A
    spawned process inherits the spawn start method; its loaders fork their workers, as in
    a training script on Linux."""
    from .ingest import play

    multiprocessing.set_start_method("fork", force=True)

    samples = Samples(context.workload)
    return play(variant_of(row, context, samples), context.workload, samples)


def play_spawned(row: Row, context: RowContext) -> JobResult:
    """Play the row in a fresh spawned process, and wait for it (Mosaic's: a process of its
    venv's interpreter)."""
    if row.peer == "mosaic":
        spec, result = context.root / f"{row.name}.spec", context.root / f"{row.name}.result"
        spec.write_bytes(pickle.dumps((row, context)))
        run_mosaic("play", str(spec), str(result))
        return cast(JobResult, pickle.loads(result.read_bytes()))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
        return fresh.submit(play_here, row, context).result(timeout=ROW_TIMEOUT_S)


Timeline = Callable[[float], list[tuple[float, float, int]]]  # the HDD proxy's requests begun since a time


def play_rows(
    rows: Sequence[Row],
    context: RowContext,
    measure: Callable[[], dict[str, int]],
    say: Callable[[str], None],
    timeline: Timeline | None = None,
) -> tuple[dict[str, JobResult], dict[str, str]]:
    """Each row in its own spawned process, in the order given; ``measure`` reads the
    origin's counters (``tier_requests``, ``tier_mb``, ``tier_repeats`` added to each row),
    ``timeline`` its requests (:func:`cold_origin`'s figures added to each row).  A peer
    that fails is reported, with its error, and the run goes on."""
    results: dict[str, JobResult] = {}
    failed: dict[str, str] = {}
    for row in rows:
        before = measure()
        try:
            result = play_spawned(row, context)
        except Exception as exc:  # a peer's failure is a figure of the run
            if row.peer == "blobsdk":
                raise
            last = (str(exc).strip().splitlines() or [""])[-1][:200]
            failed[row.name] = f"failed: {type(exc).__name__}: {last}"
            say(f"{row.name:>22}: {failed[row.name]}")
            continue
        after = measure()
        moved = {key: after[key] - before[key] for key in ("requests", "bytes", "repeats")}
        result.extra.update(tier_requests=moved["requests"], tier_mb=moved["bytes"] / 1e6, tier_repeats=moved["repeats"])
        if timeline is not None and "started_at" in result.extra:
            result.extra.update(cold_origin(result, timeline(result.extra["started_at"])))
        results[row.name] = result
        say(line(row.name, result))
    return results, failed


def cold_origin(result: JobResult, requests: list[tuple[float, float, int]]) -> dict[str, float]:
    """Where the cold epoch's time went, from the origin's requests begun between the job's
    start and epoch 0's end: ``origin_first_s`` (the first request, from the job's start: the
    set-up phase is ``result.setup_s``), ``origin_last_s`` (the end of the last),
    ``origin_cold_mbps`` (the bytes over that span) and ``drain_s`` (epoch 0's end after the
    last byte: the batches still to compute once the origin had nothing left to send)."""
    start = result.extra["started_at"]
    end = start + result.setup_s + result.epochs[0].wall_s
    cold = [(begun, ended, n) for begun, ended, n in requests if begun < end]
    if not cold:
        return {}
    first, last = min(begun for begun, _, _ in cold), max(ended for _, ended, _ in cold)
    return {
        "origin_first_s": first - start,
        "origin_last_s": last - start,
        "origin_cold_mbps": sum(n for _, _, n in cold) / 1e6 / max(last - first, 1e-9),
        "drain_s": end - last,
    }


def line(name: str, result: JobResult) -> str:
    walls = " / ".join(f"{e.wall_s:.2f}" for e in result.epochs)
    return (
        f"{name:>22}: epochs {walls} s, ingest {result.ingest_s:6.2f} s, first batch {result.extra.get('ttfb_s', 0):.2f} s, "
        f"{result.extra.get('tier_mb', 0):.0f} MB from the origin in {result.extra.get('tier_requests', 0):.0f} requests"
        + (
            f"; cold: first GET {result.extra['origin_first_s']:.2f} s, last byte {result.extra['origin_last_s']:.2f} s"
            f" ({result.extra['origin_cold_mbps']:.0f} MB/s), drain {result.extra['drain_s']:.2f} s"
            if "drain_s" in result.extra
            else ""
        )
    )
