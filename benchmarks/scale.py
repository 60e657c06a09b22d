"""scale: how each component's cost grows with its work, as curves measured
at sizes ten apart; a table, ``--json`` and a PNG (``scale.png``, or next to ``--json``).

Curves (on the real objects):

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
- the caches (benchmarks/_scale_caches.py, its docstring says what each figure is):
  ``plan_cache`` and ``floor_dict`` (the client's in-process plan cache, 10^3 ... 10^6 plans),
  ``shared_plan_cache`` and ``floor_redis_get`` (the shared plan cache in a local Redis, 10^3
  ... 10^6 plans), ``l2`` (the disk cache, 10^3 ... 10^6 chunks, 10^5 in ``--quick``: restarts with and
  without the index file, ``l2_open_index_s_at_*`` the whole restart, goal <= 2 s at 10^6, and
  its CPU apart, ``open_index_cpu_us``, which a busy host does not stretch; writing a million
  entry files takes ~40 s here, reading all their headers ~90 s) and ``l3`` (the flash node's
  store, 10^3 ... 10^6 chunks, 10^4 in ``--quick``: restart and its CPU, index memory, a
  verified hit, puts into the full cache with and without pinned chunks, once the restart's
  background reconciliation is done); ``l2_held_*``: puts into a disk cache full of chunks
  inside their hold period, 10^3 ... 10^5 (``--quick`` 10^4), against ``l2_unheld_loop_cpu``,
  the same puts with no hold period.

Each time (µs) is the p50 over batches of calls (each batch's mean), with the cyclic collector off;
each memory figure is what tracemalloc saw still held after building.  ``*_growth`` is the
value at the largest size over the value at the smallest (goal <= 1.5: flat).
``--quick`` stops each curve one size (x10) earlier.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from blobsdk.auth import ServeKey
from blobsdk.wire import AnnounceRequest, PeerHello
from servers.tracker_rules import Tracker, TrackerConfig

from ._picture import draw
from ._report import Report
from ._scale_caches import disk_cache, flash_node, held_puts, plan_cache, shared_plan_cache
from ._scale_curves import Curve, figure, per_op_quantiles, traced_bytes
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
        shared = await shared_plan_cache(range(3, top + 3), Path(tmp))
    report.metrics.update(listing)
    restarts: dict[int, float] = {}
    curves = [
        *stores,
        *tracker_swarm(range(2, top + 1)),
        *tracker_entries(range(4, top + 3)),
        *plan_cache(range(3, top + 3)),
        *shared,
        *await disk_cache(range(3, top + 3), report_s=restarts),  # quick: to 10^5
        *await flash_node(range(3, 5 if quick else 7)),  # quick: 10^3, 10^4
        *await held_puts(range(3, top + 2)),
    ]
    for size, took in restarts.items():
        report.metrics[f"l2_open_index_s_at_1e{len(str(size)) - 1}"] = took
    for curve in curves:
        curve.add_to(report)
    if png is not None:
        draw(report, png, lambda plt: figure(plt, curves))
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
