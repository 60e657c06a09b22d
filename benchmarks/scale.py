"""scale: how each component's cost grows with its work (issue 27 part 1), as curves measured
at sizes ten apart; a table, ``--json`` and a PNG (``scale.png``, or next to ``--json``).

Curves so far (in-process, on the real objects; the other components of the issue's table,
metadata stores at 10^7 paths, L2 and L3 restarts at 10^6 chunks, gc/scrub/repair, are not
measured yet):

- ``tracker_locate``: one locate (one key) in a swarm of N peers fetching that key, N = 10^2
  ... 10^4 (servers/tracker_rules.py, on a frozen clock).  Before the tracker ranked a bounded
  number of sources, a locate looked up and signed a ticket for every member of the swarm:
  O(N) per locate, O(N^2) per chunk for a swarm of N hosts.
- ``tracker_entry``: bytes per (peer, chunk) entry and ``tracker_locate_key`` µs per key
  located, with 100 peers each locating the same K keys (10^4 ... 10^6 entries);
  ``tracker_announce_key``: µs per key of a 100-key announce of fills at that size.
- ``plan_cache``: the client's in-process plan cache (blobsdk/metadata/cache.py ``_Plans``),
  10^3 ... 10^6 one-chunk plans: bytes per entry (the plan included) and a lookup of a random path.

Each time (µs) is the p50 over batches of calls (each batch's mean), with the cyclic collector off;
each memory figure is what tracemalloc saw still held after building.  ``*_growth`` is the
value at the largest size over the value at the smallest (goal <= 1.5: flat).
``--quick`` stops each curve one size (x10) earlier.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from blobsdk.auth import ServeKey
from blobsdk.metadata.cache import _Plans
from blobsdk.wire import AnnounceRequest, ChunkRef, PeerHello, ReadPlan
from servers.tracker_rules import Tracker, TrackerConfig

from ._report import Report
from ._scale_curves import Curve, missing_plot, per_op_quantiles, traced_bytes, write_png

TENANT = "t"
SERVE_KEY = ServeKey.generate()


def options(args: Any) -> dict[str, Any]:
    png = args.png or (args.json.with_suffix(".png") if args.json else Path("scale.png"))
    return {"png": png}


async def run(quick: bool = False, png: Path | None = None) -> Report:
    report = Report("scale")
    top = 3 if quick else 4  # the largest size's exponent, per curve (offset below)
    curves = [
        *tracker_swarm(range(2, top + 1)),
        *tracker_entries(range(4, top + 3)),
        *plan_cache(range(3, top + 3)),
    ]
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
    return [memory, p50s]
