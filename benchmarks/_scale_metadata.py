"""The scale benchmark's metadata curves (benchmarks/scale.py): each metadata path holding
10^3 ... 10^N paths (one-chunk plans, committed 500 a call as a bulk ingest would), grown a
decade at a time in one store, and measured at each size:

- ``*_lookup_p50`` / ``*_lookup_p99``: one getReadPlan of a random path (µs, wall, one at a time);
- ``floor_redis_hget_lookup_p50``: a raw ``HGET`` of one field of another random path's hash,
  through the same redis-py client, each right after a Redis lookup (so both see the same load):
  Redis's dict and redis-py's round trip, the floor under ``redis_lookup_p50``.  Their ratio
  stays ~1.25 at every size: a growth the floor shows too is the host's load, not the store;
- ``*_batch_ms``: a 1,000-path ``get_plans``;
- ``*_commits_per_s``: paths committed per second while growing to that size;
- ``*_bytes_per_path``: the SQLite file's size, or Redis's ``used_memory`` growth, per path;
- ``*_list_ms`` (largest size only, as a metric): listing 10^5 entries (the first 10^5 of a
  prefix holding all of them), 1,000 a page.

A full run takes SQLite and the API server one size further than Redis, to 10^7 paths
(``beyond``): Redis would hold ~10 GB there, and its fill alone would take ~20 minutes.

Paths: ``sqlite`` (the embedded store), ``redis`` (the Redis store on a local redis-server),
``api`` (the metadata API server, a subprocess, over the SQLite file just measured: HTTP and
its server's CPU on top).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from blobsdk.config import Timeouts
from blobsdk.metadata import HttpMetadataStore, RedisMetadataStore, SqliteMetadataStore
from blobsdk.metadata.base import MetadataStore
from blobsdk.net import new_session
from blobsdk.wire import ChunkRef, CommitOp, ReadPlan, etag_of
from servers.redisd import start_redis

from ._report import median, percentile
from ._scale_curves import Curve
from ._servers import server

PREFIX = "/lake/train/"
LOOKUPS = 2000
LIST_ENTRIES = 100_000


def path_of(n: int) -> str:
    return f"{PREFIX}{n:010d}"


def _plan(n: int) -> ReadPlan:
    ref = ChunkRef(block_id=f"{n:032x}", offset=0, length=4 << 20, raw_length=4 << 20, checksum=n)
    return ReadPlan(path=path_of(n), version=0, etag=etag_of((ref,), 4 << 20), size=4 << 20, chunk_size=4 << 20, chunks=(ref,))


class _Curves:
    """One metadata path's curves."""

    def __init__(self, name: str, floor: str | None = None) -> None:
        self.p50 = Curve(name, "lookup_p50", "µs per call")
        self.floor = Curve(f"floor_{floor}", "lookup_p50", "µs per call") if floor else None
        self.p99 = Curve(name, "lookup_p99", "µs per call")
        self.batch = Curve(name, "batch_ms", "ms per 1,000 paths")
        self.commits = Curve(name, "commits_per_s", "paths per second", higher_is_better=True)
        self.size = Curve(name, "bytes_per_path", "bytes per entry")
        self.list_ms = 0.0

    def all(self) -> list[Curve]:
        return [c for c in (self.p50, self.p99, self.floor, self.batch, self.commits, self.size) if c and c.points]


async def metadata_curves(exponents: range, root: Path, beyond: range = range(0)) -> tuple[list[Curve], dict[str, float]]:
    """The curves of every path, and each path's listing time at the largest size; SQLite and
    the API server over it go on to the sizes ``beyond`` (Redis stops: ~1 KB of its memory a
    path, 10 GB at 10^7)."""
    sqlite, redis, api = _Curves("sqlite"), _Curves("redis", floor="redis_hget"), _Curves("api")
    db = root / "scale.sqlite"
    filled = 0
    with start_redis(root / "redis") as redisd:
        async with SqliteMetadataStore(db) as lite, RedisMetadataStore(redisd.url, namespace="scale") as red:
            used = await _redis_used(red)
            for e in exponents:
                size = 10**e
                await _grow(lite, filled, size, sqlite)
                await _grow(red, filled, size, redis)
                filled = size
                await _measure_sqlite(lite, db, size, sqlite, api, root)
                await _measure(red, size, redis, floor=_raw_hget(red))
                redis.size.points[size] = (await _redis_used(red) - used) / size
            redis.list_ms = await _list_ms(red, filled)
    async with SqliteMetadataStore(db) as lite:  # Redis and its memory are gone
        for e in beyond:
            size = 10**e
            await _grow(lite, filled, size, sqlite)
            filled = size
            await _measure_sqlite(lite, db, size, sqlite, api, root)
        sqlite.list_ms = await _list_ms(lite, filled)
    async with _api_over(db, root) as http:
        api.list_ms = await _list_ms(http, filled)
    listing = {f"{c.p50.component}_list_1e5_ms": c.list_ms for c in (sqlite, redis, api)}
    return [*sqlite.all(), *redis.all(), *api.all()], listing


async def _measure_sqlite(lite: SqliteMetadataStore, db: Path, size: int, sqlite: _Curves, api: _Curves, root: Path) -> None:
    """SQLite's figures at ``size``, then the API server's over the same file."""
    await _measure(lite, size, sqlite)
    sqlite.size.points[size] = _sqlite_bytes(db) / size
    async with _api_over(db, root) as http:
        await _measure(http, size, api)


async def _grow(store: MetadataStore, start: int, stop: int, curves: _Curves) -> None:
    began = time.perf_counter()
    for first in range(start, stop, 500):
        await store.commit_many([CommitOp(path=path_of(n), plan=_plan(n)) for n in range(first, min(stop, first + 500))])
    curves.commits.points[stop] = (stop - start) / (time.perf_counter() - began)


async def _measure(
    store: MetadataStore, size: int, curves: _Curves, floor: Callable[[str], Awaitable[object]] | None = None
) -> None:
    rng = random.Random(size)
    for _ in range(50):  # warm connections
        await store.get_plan(path_of(rng.randrange(size)))
    latencies, floors = [], []
    for _ in range(LOOKUPS):
        path = path_of(rng.randrange(size))
        began = time.perf_counter()
        await store.get_plan(path)
        latencies.append(time.perf_counter() - began)
        if floor is not None:
            path = path_of(rng.randrange(size))
            began = time.perf_counter()
            await floor(path)
            floors.append(time.perf_counter() - began)
    curves.p50.points[size] = median(latencies) * 1e6
    if curves.floor is not None:
        curves.floor.points[size] = median(floors) * 1e6
    curves.p99.points[size] = percentile(latencies, 0.99) * 1e6
    batches = []
    for _ in range(5):
        paths = [path_of(rng.randrange(size)) for _ in range(1000)]
        began = time.perf_counter()
        await store.get_plans(paths)
        batches.append(time.perf_counter() - began)
    curves.batch.points[size] = median(batches) * 1e3


async def _list_ms(store: MetadataStore, size: int) -> float:
    """Listing the first min(10^5, size) entries of the prefix, 1,000 a page."""
    want, seen = min(LIST_ENTRIES, size), 0
    began = time.perf_counter()
    async for _ in store.list(PREFIX, limit=1000):
        seen += 1
        if seen == want:
            break
    return (time.perf_counter() - began) * 1e3


@asynccontextmanager
async def _api_over(db: Path, root: Path) -> AsyncIterator[MetadataStore]:
    with server("servers.api", ["--db", str(db)], root / "api") as url:
        async with new_session(Timeouts()) as session:
            yield HttpMetadataStore(session, url)


def _sqlite_bytes(db: Path) -> int:
    return sum(os.path.getsize(p) for p in (db, Path(f"{db}-wal")) if p.exists())


def _raw_hget(store: RedisMetadataStore) -> Callable[[str], Awaitable[object]]:
    """The floor of a Redis lookup: one field of the path's hash, nothing decoded."""
    return lambda path: store._redis.hget(store._keys.path(path), "v")


async def _redis_used(store: RedisMetadataStore) -> int:
    info = await store._redis.info("memory")
    return int(info["used_memory"])
