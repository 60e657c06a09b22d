"""The scale benchmark's cache curves (benchmarks/scale.py): the client's plan cache, the
shared plan cache in Redis, the disk cache (L2) and the L3 flash node's store under churn.

- ``plan_cache``: the in-process plan cache (blobsdk/metadata/_cache.py ``_Plans``), bytes per
  entry and a random lookup; ``floor_dict`` the same lookups in a plain dict of as many paths.
- ``shared_plan_cache``: blobsdk/metadata/_shared.py on a local redis-server holding 10^e plans:
  ``get_plan`` of a random cached path (a hit: one pipelined MGET) and Redis's bytes per entry;
  ``floor_redis_get`` a bare GET of the same entry's key on the same connection (the round trip).
- ``l2``: the disk cache restarted with and without its index file, the reconciliation after,
  index memory, a hit (entry files written in the cache's own format, not through ``put``) and
  ``open_index_cpu_us``, the restart's CPU in every thread (a busy host stretches its wall time).
  ``hit_p50`` reads files the restart's dropped page cache left cold (the device's and the file
  system's: a shard directory of 10^6 / 256 entries takes more blocks to look a name up in);
  ``hit_warm_p50`` the same keys again, the cache's own cost.
- ``l3``: the flash node's store (DiskCache as servers/flash.py opens it: ``remember_verified``):
  a restart until it serves (open + index file) and its CPU, index memory, a hit through ``open_verified``
  (the zero-copy path) and, with the cache full at its capacity, puts of new chunks that each
  evict an old one (``churn_put``, wall, p50/p99; ``churn_loop_cpu``, the event loop's CPU per
  put: the eviction choice runs there).  ``pinned_churn_*``: the same with a tenth of the cache
  pinned at the least recently used end (hydrated chunks, servers/flash.py ``pin_seconds``).
- ``l2_held``: the disk cache with a hold period, full at its capacity with chunks all inside
  it (``hold_seconds``: kept for the next epoch), and puts of new chunks that each evict the
  least recently used held one (wall p50/p99, the event loop's CPU per put);
  ``l2_unheld_loop_cpu`` the same puts into the same cache without a hold period (plain LRU:
  the floor, same run).  Before blobsdk/cache/policy.py kept the creation order for a hold
  period, each such put walked every held entry.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from blobsdk.cache import DiskCache
from blobsdk.cache._entryfile import encode_header
from blobsdk.metadata import SharedPlanCache
from blobsdk.metadata._cache import _Plans
from blobsdk.wire import ChunkRef, ReadPlan
from servers.redisd import start_redis

from ._report import median, percentile
from ._scale_curves import Curve, per_op_quantiles, traced_bytes

PAYLOAD = bytes(range(256))

# --- plan cache -------------------------------------------------------------------------------


def _plan(n: int) -> ReadPlan:
    ref = ChunkRef(block_id=f"{n:032x}", offset=0, length=4096, raw_length=4096, checksum=n)
    return ReadPlan(path=f"/data/train/{n:09d}", version=1, etag=f"{n:016x}", size=4096, chunk_size=4096, chunks=(ref,))


def plan_cache(exponents: range, lookups: int = 20_000) -> list[Curve]:
    """The plan cache holding 10^e plans: bytes per entry, a lookup of a random path."""
    memory = Curve("plan_cache", "entry", "bytes per entry")
    p50s = Curve("plan_cache", "lookup_p50", "µs per call")
    floor = Curve("floor_dict", "lookup_p50", "µs per call")  # a plain dict of as many entries: the memory's floor
    for e in exponents:
        size = 10**e
        with traced_bytes() as held:  # the plans too: the cache is what keeps them
            cache = _Plans(size, clock=lambda: 0.0)
            for n in range(size):
                plan = _plan(n)
                cache.set(plan.path, plan, 1.0)
        memory.points[size] = held() / size
        paths = [_plan(random.randrange(size)).path for _ in range(lookups)]
        p50, _ = per_op_quantiles(lambda i, c=cache, p=paths: c.get(p[i]), lookups)
        p50s.points[size] = p50 * 1e6
        plain = dict.fromkeys(_plan(n).path for n in range(size))
        p50, _ = per_op_quantiles(lambda i, d=plain, p=paths: d.get(p[i]), lookups)
        floor.points[size] = p50 * 1e6
    return [memory, p50s, floor]


# --- shared plan cache (Redis) --------------------------------------------------------------


class _NoStore:
    """The store behind the shared cache: never asked, every lookup is a hit."""

    async def get_plan(self, path: str) -> ReadPlan:
        raise AssertionError(f"a miss in the shared plan cache benchmark: {path}")


async def shared_plan_cache(exponents: range, root: Path, lookups: int = 2000) -> list[Curve]:
    """The shared plan cache holding 10^e plans in a local redis-server: a hit, bytes per entry."""
    p50s, p99s = Curve("shared_plan_cache", "lookup_p50", "µs per call"), Curve("shared_plan_cache", "lookup_p99", "µs per call")
    memory, floor = Curve("shared_plan_cache", "entry", "bytes per entry"), Curve("floor_redis_get", "p50", "µs per call")
    with start_redis(root / "shared-redis") as redisd:
        cache = SharedPlanCache(_NoStore(), redisd.url, ttl_seconds=86_400, namespace="scale")  # type: ignore[arg-type]
        try:
            used, filled = await _redis_used(cache), 0
            for e in exponents:
                size = 10**e
                for start in range(filled, size, 5000):
                    await cache._put([(_plan(n), 0) for n in range(start, min(size, start + 5000))])
                filled = size
                memory.points[size] = (await _redis_used(cache) - used) / size
                picks = [_plan(random.randrange(size)).path for _ in range(lookups)]
                p50, p99 = await _async_quantiles(lambda i, p=picks: cache.get_plan(p[i]), lookups)  # type: ignore[misc]
                p50s.points[size], p99s.points[size] = p50 * 1e6, p99 * 1e6
                keys = [cache._keys(path)[1] for path in picks]
                p50, _ = await _async_quantiles(lambda i, k=keys: cache._redis.get(k[i]), lookups)  # type: ignore[misc]
                floor.points[size] = p50 * 1e6
            assert cache.misses == 0, "every lookup must be a hit"
        finally:
            await cache._redis.aclose()
    return [p50s, p99s, memory, floor]


async def _redis_used(cache: SharedPlanCache) -> int:
    info = await cache._redis.info("memory")
    return int(info["used_memory"])


async def _async_quantiles(op: Callable[[int], Awaitable[Any]], count: int) -> tuple[float, float]:
    """p50 and p99 (seconds, wall) of ``await op(i)``, each call timed alone."""
    took: list[float] = []
    for i in range(count):
        began = time.perf_counter()
        await op(i)
        took.append(time.perf_counter() - began)
    return median(took), percentile(took, 0.99)


# --- L2 / L3 disk cache ---------------------------------------------------------------------


async def disk_cache(exponents: range, hits: int = 2000, report_s: dict[int, float] | None = None) -> list[Curve]:
    """The disk cache holding 10^e chunks: restarts (header scan, index file), the background
    reconciliation, index memory, a hit."""
    scans, loads = Curve("l2", "open_scan_us", "µs per entry"), Curve("l2", "open_index_us", "µs per entry")
    reconciles, memory = Curve("l2", "reconcile_us", "µs per entry"), Curve("l2", "index_entry", "bytes per entry")
    p50s, cpus = Curve("l2", "hit_p50", "µs per call"), Curve("l2", "open_index_cpu_us", "µs per entry")
    warm = Curve("l2", "hit_warm_p50", "µs per call")
    report_s = {} if report_s is None else report_s  # size -> seconds of the restart from the index file
    for e in exponents:
        size = 10**e
        with tempfile.TemporaryDirectory(prefix="bench-scale-l2-") as root:  # under $TMPDIR
            keys = await asyncio.to_thread(_write_entries, Path(root), size)
            took, _, cache = await _open_timed(root)  # no index file yet: every header
            scans.points[size] = took / size * 1e6
            await cache.aclose()  # writes the index file
            took, cpu, cache = await _open_timed(root)
            loads.points[size], cpus.points[size] = took / size * 1e6, cpu / size * 1e6
            report_s[size] = took
            began = time.perf_counter()
            await cache.reconciled()
            reconciles.points[size] = (time.perf_counter() - began) / size * 1e6
            picks = [random.choice(keys) for _ in range(hits)]
            for curve in (p50s, warm):  # after the restart's dropped page cache, then again
                began = time.perf_counter()
                for key in picks:
                    await cache.get(key)
                curve.points[size] = (time.perf_counter() - began) / hits * 1e6  # the mean: one hit is a thread hop
            await cache.aclose()
            with traced_bytes() as held:  # apart from the timed open: tracemalloc slows every allocation
                _, _, cache = await _open_timed(root)
            memory.points[size] = held() / size
            await cache.aclose()
    return [scans, loads, reconciles, memory, p50s, cpus, warm]


async def _open_timed(root: str, **settings: Any) -> tuple[float, float, DiskCache]:
    """Seconds to open the cache at ``root`` (the page cache dropped first, where allowed),
    the process's CPU seconds for it (every thread: the index file is read on the executor;
    apart from the wall time, which a busy host stretches), and the cache, open."""
    await asyncio.to_thread(_drop_page_cache)
    cache = DiskCache(root, **{"capacity_bytes": 1 << 40, "threads": 4, **settings})
    began, cpu = time.perf_counter(), time.process_time()
    await cache.open()
    took = time.perf_counter() - began
    return took, time.process_time() - cpu, cache


def _write_entries(root: Path, size: int) -> list[str]:
    """``size`` entry files of 256 bytes in the cache's format; their keys."""
    keys = [f"{random.getrandbits(128):032x}" for _ in range(size)]
    (root / "FORMAT").write_text("blobsdk disk-cache format 1\n")
    shards = {key[:2] for key in keys}
    for shard in shards:
        (root / shard).mkdir()
    view = memoryview(PAYLOAD)
    for key in keys:
        with open(root / key[:2] / key, "wb") as out:
            out.write(encode_header(key, "default", view))
            out.write(PAYLOAD)
    return keys


def _drop_page_cache() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as drop:
            drop.write("3\n")
    except OSError:
        pass  # not root: a warm restart, said in the report's notes


# --- the L3 flash node's store -------------------------------------------------------------


async def flash_node(exponents: range, hits: int = 2000, churn: int = 1000) -> list[Curve]:
    """The L3 node's store holding 10^e chunks: a restart until it serves, index memory, a
    verified hit, and puts into the full cache (each evicts one), with and without pins."""
    restarts, memory = Curve("l3", "restart_us", "µs per entry"), Curve("l3", "index_entry", "bytes per entry")
    p50s, cpus = Curve("l3", "hit_p50", "µs per call"), Curve("l3", "restart_cpu_us", "µs per entry")
    churns = {
        f"{pinned}churn_{figure}": Curve("l3", f"{pinned}churn_{figure}", "µs per put")
        for pinned in ("", "pinned_")
        for figure in ("put_p50", "put_p99", "loop_cpu")
    }
    node = {"remember_verified": True, "name": "l3", "threads": 4}
    for e in exponents:
        size = 10**e
        with tempfile.TemporaryDirectory(prefix="bench-scale-l3-") as root:
            keys = await asyncio.to_thread(_write_entries, Path(root), size)
            _, _, cache = await _open_timed(root, **node)
            await cache.reconciled()
            await cache.aclose()  # the index file a node's restart loads
            with traced_bytes() as held:
                _, _, cache = await _open_timed(root, **node)
            memory.points[size] = held() / size
            await cache.aclose()
            took, cpu, cache = await _open_timed(root, capacity_bytes=size * len(PAYLOAD), **node)
            restarts.points[size] = took / size * 1e6  # open + index file: then it serves
            cpus.points[size] = cpu / size * 1e6
            await cache.reconciled()  # the hits and puts below measure a node in service, not its restart's tail
            p50s.points[size] = await _verified_hit(cache, random.sample(keys, min(size, hits))) * 1e6
            for pinned in ("", "pinned_"):
                if pinned:  # a tenth of the cache pinned at its least recently used end
                    for key in list(cache._ledger.index.lru)[: size // 10]:
                        cache.pin(key, 1e9)
                p50, p99, cpu = await _churn(cache, churn)
                for figure, value in (("put_p50", p50), ("put_p99", p99), ("loop_cpu", cpu)):
                    churns[f"{pinned}churn_{figure}"].points[size] = value * 1e6
            await cache.aclose()
    return [restarts, memory, p50s, *churns.values(), cpus]


async def _verified_hit(cache: DiskCache, keys: list[str]) -> float:
    """Seconds (wall, the mean) of a hit served as the node serves it: ``open_verified``,
    the file handed out open (each key read once by ``get`` first, which verifies it)."""
    for key in keys:
        await cache.get(key)
    began = time.perf_counter()
    for key in keys:
        opened = await cache.open_verified(key)
        assert opened is not None, f"{key} was verified"
        opened.close()
    return (time.perf_counter() - began) / len(keys)


async def _churn(cache: DiskCache, puts: int) -> tuple[float, float, float]:
    """``puts`` new 256-byte chunks into the full cache: p50 and p99 seconds (wall) per put,
    and the event loop thread's CPU seconds per put (the eviction plan runs there)."""
    took: list[float] = []
    cpu = time.thread_time()
    for _ in range(puts):
        key = f"{random.getrandbits(128):032x}"
        began = time.perf_counter()
        stored = await cache.put(key, PAYLOAD)
        took.append(time.perf_counter() - began)
        assert stored, "a put into a full cache evicts"
    return median(took), percentile(took, 0.99), (time.thread_time() - cpu) / puts


# --- a hold period ----------------------------------------------------------------------------


async def held_puts(exponents: range, churn: int = 1000) -> list[Curve]:
    """The disk cache full of 10^e chunks inside their hold period: puts of new chunks (each
    evicts a held one), and the same puts without a hold period (the floor)."""
    curves = {
        figure: Curve("l2", figure, "µs per put")
        for figure in ("held_put_p50", "held_put_p99", "held_loop_cpu", "unheld_loop_cpu")
    }
    for e in exponents:
        size = 10**e
        with tempfile.TemporaryDirectory(prefix="bench-scale-held-") as root:
            await asyncio.to_thread(_write_entries, Path(root), size)
            for hold in (3600.0, 0.0):  # the files were just written: all inside an hour's hold
                _, _, cache = await _open_timed(root, capacity_bytes=size * len(PAYLOAD), hold_seconds=hold)
                p50, p99, cpu = await _churn(cache, churn)
                if hold:
                    assert cache.stats()["hold_evictions"] == churn, "each put evicts a held chunk"
                    curves["held_put_p50"].points[size], curves["held_put_p99"].points[size] = p50 * 1e6, p99 * 1e6
                    curves["held_loop_cpu"].points[size] = cpu * 1e6
                else:
                    curves["unheld_loop_cpu"].points[size] = cpu * 1e6
                await cache.aclose()
    return list(curves.values())
