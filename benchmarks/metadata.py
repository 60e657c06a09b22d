"""metadata: getReadPlan through every metadata path, in one run, over the same
blobs (10,000 of 4 chunks; ``--quick``: 2,000):

- ``sqlite``: the embedded SQLite store, in process;
- ``redis``: the Redis store, straight to a local ``redis-server``;
- ``api_sqlite`` / ``api_redis``: through the metadata API server (a subprocess) over each;
- ``shared_cache``: through the shared plan cache (Redis) in front of the API server over
  SQLite, warm: what the thousandth reader of a dataset sees after the first.

Per path: p50 and p99 of single lookups (one at a time, 2,000 samples; ``--quick``: 300),
and lookups/s with 64 in flight.  JSON: ``redis_plan_p50_ms`` (goal <= 1) and
``shared_cache_p50_ms`` (goal <= 0.5), and per path its ``*_p50_ms``, ``*_p99_ms``,
``*_lookups_per_s``; ratio ``shared_cache_vs_api`` (the cache's p50 ÷ the API server's).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from blobsdk.config import Timeouts
from blobsdk.metadata import HttpMetadataStore, RedisMetadataStore, SharedPlanCache, SqliteMetadataStore
from blobsdk.metadata.base import MetadataStore
from blobsdk.net import new_session
from blobsdk.wire import ChunkRef, CommitOp, ReadPlan, etag_of
from servers.cluster import start_cluster
from servers.redisd import start_redis

from ._report import Report, percentile

IN_FLIGHT = 64


def _plan(path: str, seed: int) -> ReadPlan:
    chunks = tuple(
        ChunkRef(block_id=f"{seed:032x}", offset=i << 22, length=1 << 22, raw_length=1 << 22, checksum=seed + i) for i in range(4)
    )
    return ReadPlan(path=path, version=0, etag=etag_of(chunks, 4 << 22), size=4 << 22, chunk_size=1 << 22, chunks=chunks)


async def _fill(store: MetadataStore, paths: Sequence[str]) -> None:
    for start in range(0, len(paths), 500):  # one bucket: a Redis Cluster would take these batches too
        await store.commit_many([CommitOp(path=p, plan=_plan(p, i)) for i, p in enumerate(paths[start : start + 500], start)])


async def _measure(report: Report, name: str, store: MetadataStore, paths: Sequence[str], samples: int) -> None:
    rng = random.Random(1)
    for path in rng.sample(list(paths), min(200, len(paths))):  # warm connections (and the shared cache)
        await store.get_plan(path)
    if name == "shared_cache":
        await store.get_plans(list(paths))  # every plan in the cache, as after the first reader
    latencies = []
    for path in (rng.choice(paths) for _ in range(samples)):
        begun = time.perf_counter()
        await store.get_plan(path)
        latencies.append(time.perf_counter() - begun)
    report.metrics[f"{name}_p50_ms"] = percentile(latencies, 0.5) * 1000
    report.metrics[f"{name}_p99_ms"] = percentile(latencies, 0.99) * 1000
    queue = [rng.choice(paths) for _ in range(samples * 4)]

    async def worker() -> None:
        while queue:
            await store.get_plan(queue.pop())

    begun = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    report.metrics[f"{name}_lookups_per_s"] = samples * 4 / (time.perf_counter() - begun)


async def run(quick: bool = False) -> Report:
    report = Report("metadata")
    blobs, samples = (2_000, 300) if quick else (10_000, 2_000)
    paths = [f"/bench/data/{i:06d}" for i in range(blobs)]
    with tempfile.TemporaryDirectory(prefix="bench-metadata-") as tmp:
        root = Path(tmp)
        with start_redis(root / "redis") as redis:
            async with AsyncExitStack() as stack:
                sqlite = await stack.enter_async_context(SqliteMetadataStore(root / "direct.sqlite"))
                await _fill(sqlite, paths)
                await _measure(report, "sqlite", sqlite, paths, samples)
                direct = await stack.enter_async_context(RedisMetadataStore(redis.url, namespace="direct"))
                await _fill(direct, paths)
                await _measure(report, "redis", direct, paths, samples)
                session = await stack.enter_async_context(new_session(Timeouts()))
                over_sqlite = await stack.enter_async_context(
                    start_cluster(root / "api-sqlite", block_servers=1, l3_nodes=0, trackers=0)
                )
                over_redis = await stack.enter_async_context(
                    start_cluster(root / "api-redis", block_servers=1, l3_nodes=0, metadata=redis.url, trackers=0)
                )
                for name, cluster in (("api_sqlite", over_sqlite), ("api_redis", over_redis)):
                    assert cluster.config is not None and cluster.config.api_url is not None
                    api = HttpMetadataStore(session, cluster.config.api_url)
                    await _fill(api, paths)
                    await _measure(report, name, api, paths, samples)
                assert over_sqlite.config is not None and over_sqlite.config.api_url is not None
                api = HttpMetadataStore(session, over_sqlite.config.api_url)
                shared = SharedPlanCache(api, redis.url, namespace="shared", ttl_seconds=600)
                stack.push_async_callback(shared._redis.aclose)
                await _measure(report, "shared_cache", shared, paths, samples)
    m = report.metrics
    report.metrics["redis_plan_p50_ms"] = m["redis_p50_ms"]
    report.metrics["shared_cache_p50_ms"] = m["shared_cache_p50_ms"]
    report.ratios["shared_cache_vs_api"] = m["shared_cache_p50_ms"] / m["api_sqlite_p50_ms"]
    report.goals.update(redis_plan_p50_ms="<= 1", shared_cache_p50_ms="<= 0.5")
    return report
