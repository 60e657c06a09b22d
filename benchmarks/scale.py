"""scale: how each component's cost grows with its work (issue 27 part 1), as curves measured
at sizes ten apart; a table, ``--json`` and a PNG (``scale.png``, or next to ``--json``).

Curves so far (on the real objects; not measured yet: the L3 node's eviction under churn,
the shared plan cache):

- ``sqlite_*``, ``redis_*``, ``api_*``: each metadata path at 10^3 ... 10^6 paths
  (benchmarks/_scale_metadata.py: lookup p50/p99, a 1,000-path batch, commit rate, bytes per
  path, and ``*_list_1e5_ms``, listing 10^5 entries of the prefix at the largest size).  A full
  run takes SQLite and the API server over it to 10^7 paths and Redis to 10^6 (at 10^7 Redis
  would hold ~10 GB); ``--quick`` stops every store at 10^5.

- ``repair_*``, ``gc_*``, ``scrub_*``: L4's background work at 10^4 ... 10^6 blocks
  (benchmarks/_scale_ops.py): a repair batch's live chunks through the metadata store's
  block -> plans index, against the walk of every plan repair did before it
  (``repair_walk_batch_ms``: O(plans) per batch); a gc pass and a scrub per block, and gc's
  peak memory per block.
- ``tracker_locate``: one locate (one key) in a swarm of N peers fetching that key, N = 10^2
  ... 10^4 (servers/tracker_rules.py, on a frozen clock).  Before the tracker ranked a bounded
  number of sources, a locate looked up and signed a ticket for every member of the swarm:
  O(N) per locate, O(N^2) per chunk for a swarm of N hosts.
- ``tracker_entry``: bytes per (peer, chunk) entry and ``tracker_locate_key`` µs per key
  located, with 100 peers each locating the same K keys (10^4 ... 10^6 entries);
  ``tracker_announce_key``: µs per key of a 100-key announce of fills at that size.
- ``l2``: the disk cache (blobsdk/cache/disk.py, the L2 and the L3 node's store) holding
  10^3 ... 10^5 chunks of 256 bytes (10^6 apart: writing a million files takes ~40 minutes on
  the dev VM; ``disk_cache(range(6, 7))``): ``l2_open_scan_us``, a restart that reads every
  header (no index file: the first start, or after a crash) and ``l2_open_index_us``, a restart
  from the index file written at close, both µs per entry with the page cache dropped when
  this process may (root), and ``l2_open_index_s_at_*`` the whole restart (goal <= 2 s at 10^6);
  then ``l2_reconcile_us`` (the background pass after it),
  ``l2_index_entry`` bytes per entry, and ``l2_hit_p50`` (µs, wall: the mean of 2,000) a 256-byte hit.  The entry
  files are written with the cache's own file format (blobsdk/cache/_entryfile.py), not through
  ``put``: a million puts take ~10 minutes here.
- ``plan_cache``: the client's in-process plan cache (blobsdk/metadata/cache.py ``_Plans``),
  10^3 ... 10^6 one-chunk plans: bytes per entry (the plan included) and a lookup of a random path;
  ``floor_dict_lookup_p50`` a lookup in a plain dict of as many paths, the same random order:
  past the CPU's caches every random lookup waits on memory, so no structure stays flat.

Each time (µs) is the p50 over batches of calls (each batch's mean), with the cyclic collector off;
each memory figure is what tracemalloc saw still held after building.  ``*_growth`` is the
value at the largest size over the value at the smallest (goal <= 1.5: flat).
``--quick`` stops each curve one size (x10) earlier.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from blobsdk.auth import ServeKey
from blobsdk.cache._entryfile import encode_header
from blobsdk.cache.disk import DiskCache
from blobsdk.metadata.cache import _Plans
from blobsdk.wire import AnnounceRequest, ChunkRef, PeerHello, ReadPlan
from servers.tracker_rules import Tracker, TrackerConfig

from ._report import Report
from ._scale_curves import Curve, missing_plot, per_op_quantiles, traced_bytes, write_png
from ._scale_metadata import metadata_curves
from ._scale_ops import ops_curves

TENANT = "t"
SERVE_KEY = ServeKey.generate()


def options(args: Any) -> dict[str, Any]:
    png = args.png or (args.json.with_suffix(".png") if args.json else Path("scale.png"))
    return {"png": png}


async def run(quick: bool = False, png: Path | None = None) -> Report:
    report = Report("scale")
    top = 3 if quick else 4  # the largest size's exponent, per curve (offset below)
    with tempfile.TemporaryDirectory(prefix="bench-scale-metadata-") as tmp:
        beyond = range(0) if quick else range(top + 3, top + 4)  # SQLite and the API server to 10^7
        stores, listing = await metadata_curves(range(3, top + 3), Path(tmp), beyond)
        stores += await ops_curves(range(4, top + 3), Path(tmp))
    report.metrics.update(listing)
    restarts: dict[int, float] = {}
    curves = [
        *stores,
        *tracker_swarm(range(2, top + 1)),
        *tracker_entries(range(4, top + 3)),
        *plan_cache(range(3, top + 3)),
        *await disk_cache(range(3, 6), report_s=restarts),  # 10^6 files take ~40 min to write here: apart (docs)
    ]
    for size, took in restarts.items():
        report.metrics[f"l2_open_index_s_at_1e{len(str(size)) - 1}"] = took
    for curve in curves:
        curve.add_to(report)
    if png is not None:
        why = missing_plot()
        if why is None:
            write_png(curves, png)
            report.details["png"] = str(png)
        else:
            report.skipped["png"] = why
    return report


# --- tracker ----------------------------------------------------------------------------------


def _pid(n: int) -> str:
    return f"{n:032x}"


def _tracker(peers: int) -> Tracker:
    config = TrackerConfig(peer_ttl_s=1e9, max_peers=peers + 1)
    tracker = Tracker(config, clock=lambda: 1000.0, wall=lambda: 1.7e9)
    for n in range(peers):
        address = f"http://10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}:7400"
        tracker.hello(TENANT, PeerHello(serve_key=SERVE_KEY.hex, peer_id=_pid(n), address=address))
    return tracker


def tracker_swarm(exponents: range, probes: int = 1000) -> list[Curve]:
    """A locate in a swarm of 10^e fetchers of its key."""
    p50s = Curve("tracker", "locate_p50", "µs per call")
    p99s = Curve("tracker", "locate_p99", "µs per call")
    key = "c" * 40
    for e in exponents:
        size = 10**e
        tracker = _tracker(size + probes)
        for n in range(size):
            tracker.locate(TENANT, _pid(n), [key])
        p50, p99 = per_op_quantiles(lambda i, t=tracker, s=size: t.locate(TENANT, _pid(s + i), [key]), probes, batch=50)
        p50s.points[size], p99s.points[size] = p50 * 1e6, p99 * 1e6
    return [p50s, p99s]


def tracker_entries(exponents: range, peers: int = 100) -> list[Curve]:
    """``peers`` peers each locating the same 10^e / peers keys (a (peer, key) entry each)."""
    memory = Curve("tracker", "entry", "bytes per entry")
    locates = Curve("tracker", "locate_key", "µs per key")
    announces = Curve("tracker", "announce_key", "µs per key")
    for e in exponents:
        entries = 10**e
        keys = [f"{k:040x}" for k in range(entries // peers)]
        batches = [keys[i : i + 4096] for i in range(0, len(keys), 4096)]
        with traced_bytes() as held:
            tracker = _tracker(peers)
            for n in range(peers):
                for batch in batches:
                    tracker.locate(TENANT, _pid(n), batch)
        memory.points[entries] = held() / entries
        fresh = _tracker(peers)  # timed apart from tracemalloc, which slows every allocation

        def locate_all(n: int, t: Tracker = fresh, batches: list[list[str]] = batches) -> None:
            for batch in batches:
                t.locate(TENANT, _pid(n), batch)

        per_peer, _ = per_op_quantiles(locate_all, peers, batch=10)
        locates.points[entries] = per_peer / len(keys) * 1e6
        filled = [keys[i : i + 100] for i in range(0, min(len(keys), 10_000), 100)]

        def announce(i: int, t: Tracker = fresh, filled: list[list[str]] = filled) -> None:
            t.announce(TENANT, AnnounceRequest(peer_id=_pid(i % peers), filled=filled[i // peers % len(filled)]))

        per_announce, _ = per_op_quantiles(announce, min(len(filled) * peers, 2000), batch=20)
        announces.points[entries] = per_announce / 100 * 1e6
    return [memory, locates, announces]


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


# --- L2 / L3 disk cache ---------------------------------------------------------------------

PAYLOAD = bytes(range(256))


async def disk_cache(exponents: range, hits: int = 2000, report_s: dict[int, float] | None = None) -> list[Curve]:
    """The disk cache holding 10^e chunks: restarts (header scan, index file), the background
    reconciliation, index memory, a hit."""
    scans, loads = Curve("l2", "open_scan_us", "µs per entry"), Curve("l2", "open_index_us", "µs per entry")
    reconciles, memory = Curve("l2", "reconcile_us", "µs per entry"), Curve("l2", "index_entry", "bytes per entry")
    p50s = Curve("l2", "hit_p50", "µs per call")
    report_s = {} if report_s is None else report_s  # size -> seconds of the restart from the index file
    for e in exponents:
        size = 10**e
        with tempfile.TemporaryDirectory(prefix="bench-scale-l2-") as root:  # under $TMPDIR
            keys = await asyncio.to_thread(_write_entries, Path(root), size)
            took, cache = await _open_timed(root)  # no index file yet: every header
            scans.points[size] = took / size * 1e6
            await cache.aclose()  # writes the index file
            took, cache = await _open_timed(root)
            loads.points[size] = took / size * 1e6
            report_s[size] = took
            began = time.perf_counter()
            await cache.reconciled()
            reconciles.points[size] = (time.perf_counter() - began) / size * 1e6
            picks = [random.choice(keys) for _ in range(hits)]
            began = time.perf_counter()
            for key in picks:
                await cache.get(key)
            p50s.points[size] = (time.perf_counter() - began) / hits * 1e6  # the mean: one hit is a thread hop
            await cache.aclose()
            with traced_bytes() as held:  # apart from the timed open: tracemalloc slows every allocation
                _, cache = await _open_timed(root)
            memory.points[size] = held() / size
            await cache.aclose()
    return [scans, loads, reconciles, memory, p50s]


async def _open_timed(root: str) -> tuple[float, DiskCache]:
    """Seconds to open the cache at ``root`` (the page cache dropped first, where allowed),
    and the cache, open."""
    await asyncio.to_thread(_drop_page_cache)
    cache = DiskCache(root, capacity_bytes=1 << 40, threads=4)
    began = time.perf_counter()
    await cache.open()
    took = time.perf_counter() - began
    return took, cache


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
