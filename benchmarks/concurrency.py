"""concurrency: fixed in-flight limits against blobsdk's adaptive limiter, at an origin
that serves best at 4 concurrent requests.

The origin is one block server process whose GETs go through a fault gate
(servers/_common/faults.py): 4 service slots of 10 ms each, at most 4 more requests waiting
for one (queueing: latency grows, throughput does not), and 429 for anything beyond that.
So it serves 400 reads/s at best; more concurrency only buys queueing, then 429s, and
answering the 429s costs both processes CPU.  One block of 64 chunks of 64 KiB.

The client: one aiohttp session and HttpBlockStore (its own limiter, if any, set to 256:
never binding); W=64 workers read random chunks in a closed loop, 1 s of warm-up then a
measured window (3 s with --quick, else 10 s), each GET through the policy's gate:

- ``fixed1``, ``fixed4``, ``fixed64``: an ``asyncio.Semaphore`` of that many;
- ``adaptive``: ``AdaptiveLimiter`` with its default config, ``acquire(size=...)``, and
  ``permit.overloaded()`` on a 429.

A 429 (blobsdk ``Unavailable``) is a rejected attempt: the worker sleeps 5 ms and tries the
same read again, so the load stays.  A read's latency runs from when its worker first
wanted it until its bytes arrived: queueing in the client-side gate and every rejected
attempt included (what the caller waits for).  Goodput counts reads that completed.

The adaptive run starts cold: a new limiter at its initial limit, 64 workers at once, and an
origin still serving the requests fixed64's workers abandoned (for a few tens of ms it
rejects everything), as a training job starting at a busy server.

Metrics per policy: ``goodput_rps``, ``goodput_MBps``, ``p50_ms``, ``p99_ms``,
``rejected_per_s``; for adaptive also its final limit, the limiter's stats, the lowest limit
it went down to, and how fast it settled, in seconds from the start of its run (warm-up
included; the run's length if never):

- ``adaptive_settle_s`` (time-to-settle): until the end of the first ``SETTLE_WINDOW_S``
  (0.1 s) whose goodput reaches 90% of the best fixed policy's (goal <= 1.0: settled within
  the warm-up, so the measured window sees the settled limit); 0.1 s is its resolution;
- ``adaptive_limit_settle_s``: until the limit is, from then on, within ``max(1, 20%)`` of
  its final value (the limit is read after every attempt).

Ratios against the best fixed policy of the run (see ``_best_fixed``):
``goodput_vs_best_fixed`` (goal >= 0.9) and ``p99_vs_best_fixed`` (goal <= 1.5);
``goodput_vs_max_fixed`` is against the highest fixed goodput, tie or not.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from blobsdk.config import LimiterConfig, Timeouts
from blobsdk.errors import Unavailable
from blobsdk.net import new_session
from blobsdk.net.limiter import AdaptiveLimiter
from blobsdk.sources import HttpBlockStore
from blobsdk.sources.base import new_block_id

from ._report import Report, percentile
from ._servers import block_servers

CHUNK = 64 << 10
CHUNKS = 64
WORKERS = 64
BACKOFF_S = 0.005
WARMUP_S = 1.0
ORIGIN = ["--fault", "methods=GET;route=/v1/blocks;max_in_service=4;queue_limit=4;overload=reject;latency_ms=10"]
FIXED = (1, 4, 64)
TIE = 0.1  # fixed limits this close to the best goodput are tied; the lowest p99 wins
SETTLE_WINDOW_S = 0.1
SETTLE_SHARE = 0.9  # of the best fixed goodput
SETTLE_BAND = 0.2  # the limit within max(1, 20%) of its final value
UNLIMITED = LimiterConfig(initial=256, min_limit=256, max_limit=256)  # never below W, even when probing


class _NoPermit:
    def overloaded(self) -> None:
        """A fixed limit does not learn from a 429."""


class _Fixed:
    """A fixed in-flight limit with the limiter's ``acquire`` shape."""

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)

    @asynccontextmanager
    async def acquire(self, size: int) -> AsyncIterator[_NoPermit]:
        async with self._slots:
            yield _NoPermit()


Gate = _Fixed | AdaptiveLimiter


class _Window:
    """What completed inside the measured window ``[start, end)``; and over the whole run
    (in seconds since it began, warm-up included) when each read completed and, given a
    ``limiter``, its limit after each attempt (not for the fixed policies: recording
    fixed64's ~9,000 attempts/s put the adaptive run's first requests ~7 ms later, long
    enough for the origin to drain what fixed64 left, which hid the cold burst)."""

    def __init__(self, start: float, end: float, limiter: AdaptiveLimiter | None) -> None:
        self.start, self.end = start, end
        self.latencies: list[float] = []
        self.rejected = 0
        self.completed: list[float] = []
        self.limits: list[tuple[float, int]] = []
        self._limiter = limiter

    def inside(self, t: float) -> bool:
        return self.start <= t < self.end

    def since_run_start(self, t: float) -> float:
        return t - self.start + WARMUP_S

    def attempted(self) -> None:
        if self._limiter is not None:
            self.limits.append((self.since_run_start(time.perf_counter()), self._limiter.limit))


async def run(quick: bool = False) -> Report:
    seconds = 3.0 if quick else 10.0
    report = Report("concurrency")
    with tempfile.TemporaryDirectory(prefix="bench-concurrency-") as tmp, block_servers(Path(tmp), [ORIGIN]) as (url,):
        async with new_session(Timeouts()) as session:
            store = _store(session, url)
            block_id = await _write_block(store)
            for limit in FIXED:
                await _measure(report, f"fixed{limit}", _Fixed(limit), store, block_id, seconds)
            limiter = AdaptiveLimiter(url)
            window = await _measure(report, "adaptive", limiter, store, block_id, seconds)
    _limiter_metrics(report, limiter)
    _ratios(report)
    _settle_metrics(report, window, WARMUP_S + seconds)
    return report


def _store(session: aiohttp.ClientSession, url: str) -> HttpBlockStore:
    """An HttpBlockStore whose own limiter (if this blobsdk has one) never binds, so the
    policy's gate is the only limit in the way."""
    try:
        return HttpBlockStore(session, url, limiter=AdaptiveLimiter(url, UNLIMITED))
    except TypeError:  # an HttpBlockStore without a built-in limiter
        return HttpBlockStore(session, url)


async def _write_block(store: HttpBlockStore) -> str:
    block_id = new_block_id()
    await store.write_block(block_id, [os.urandom(CHUNK) for _ in range(CHUNKS)])
    return block_id


async def _measure(report: Report, name: str, gate: Gate, store: HttpBlockStore, block_id: str, seconds: float) -> _Window:
    """Run the workers through warm-up and the window, then record what the window saw."""
    start = time.perf_counter() + WARMUP_S
    window = _Window(start, start + seconds, gate if isinstance(gate, AdaptiveLimiter) else None)
    workers = [asyncio.create_task(_worker(store, gate, block_id, random.Random(i), window)) for i in range(WORKERS)]
    await asyncio.sleep(WARMUP_S + seconds)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    _record(report, name, window, seconds)
    return window


async def _worker(store: HttpBlockStore, gate: Gate, block_id: str, rng: random.Random, window: _Window) -> None:
    """Read random chunks forever; a rejected read is retried after a short backoff."""
    while True:
        wanted = time.perf_counter()
        offset = rng.randrange(CHUNKS) * CHUNK
        while not await _attempt(store, gate, block_id, offset, window):
            if window.inside(time.perf_counter()):
                window.rejected += 1
            await asyncio.sleep(BACKOFF_S)
        done = time.perf_counter()
        window.completed.append(window.since_run_start(done))
        if window.inside(done):
            window.latencies.append(done - wanted)


async def _attempt(store: HttpBlockStore, gate: Gate, block_id: str, offset: int, window: _Window) -> bool:
    """One GET through the gate: whether it succeeded (False: the origin shed it)."""
    try:
        async with gate.acquire(size=CHUNK) as permit:
            try:
                await store.read_range(block_id, offset, CHUNK)
            except Unavailable:
                permit.overloaded()
                return False
        return True
    finally:
        window.attempted()


def _record(report: Report, name: str, window: _Window, seconds: float) -> None:
    lat = window.latencies or [float("nan")]
    m = report.metrics
    m[f"{name}_goodput_rps"] = len(window.latencies) / seconds
    m[f"{name}_goodput_MBps"] = len(window.latencies) * CHUNK / seconds / 1e6
    m[f"{name}_p50_ms"] = percentile(lat, 0.5) * 1000
    m[f"{name}_p99_ms"] = percentile(lat, 0.99) * 1000
    m[f"{name}_rejected_per_s"] = window.rejected / seconds


def _limiter_metrics(report: Report, limiter: AdaptiveLimiter) -> None:
    stats = limiter.stats()
    report.metrics["adaptive_final_limit"] = stats["limit"]
    for key in ("drops", "probes", "min_rtt_ms"):
        report.metrics[f"adaptive_{key}"] = stats[key]


def _ratios(report: Report) -> None:
    m = report.metrics
    best = _best_fixed(m)
    m["best_fixed_limit"] = best
    report.ratios["goodput_vs_best_fixed"] = m["adaptive_goodput_rps"] / m[f"fixed{best}_goodput_rps"]
    report.ratios["p99_vs_best_fixed"] = m["adaptive_p99_ms"] / m[f"fixed{best}_p99_ms"]
    report.ratios["goodput_vs_max_fixed"] = m["adaptive_goodput_rps"] / max(m[f"fixed{limit}_goodput_rps"] for limit in FIXED)
    report.goals.update(goodput_vs_best_fixed=">= 0.9", p99_vs_best_fixed="<= 1.5")


def _best_fixed(m: dict[str, float]) -> int:
    """The fixed limit an operator would pick: the best goodput, where limits within TIE of
    it count as tied and the lowest p99 among them wins (fixed64 can edge out fixed4 by
    keeping the origin's queue full, at several times its p99)."""
    top = max(m[f"fixed{limit}_goodput_rps"] for limit in FIXED)
    tied = [limit for limit in FIXED if m[f"fixed{limit}_goodput_rps"] >= (1 - TIE) * top]
    return min(tied, key=lambda limit: m[f"fixed{limit}_p99_ms"])


def _settle_metrics(report: Report, window: _Window, run_s: float) -> None:
    """Time-to-settle of the adaptive run (see the module docstring)."""
    m = report.metrics
    reads = SETTLE_SHARE * m[f"fixed{int(m['best_fixed_limit'])}_goodput_rps"] * SETTLE_WINDOW_S
    m["adaptive_settle_s"] = _goodput_settle(window.completed, reads, run_s)
    m["adaptive_limit_settle_s"] = _limit_settle(window.limits, run_s)
    m["adaptive_lowest_limit"] = min((limit for _, limit in window.limits), default=0)
    report.goals["adaptive_settle_s"] = "<= 1.0"


def _goodput_settle(completed: list[float], reads: float, run_s: float) -> float:
    """The end of the first SETTLE_WINDOW_S in which ``reads`` reads completed (a window
    ends at a completion, the last it counts); ``run_s`` if none."""
    begin = 0
    for end, t in enumerate(completed):
        while completed[begin] <= t - SETTLE_WINDOW_S:
            begin += 1
        if t >= SETTLE_WINDOW_S and end - begin + 1 >= reads:
            return t
    return run_s


def _limit_settle(limits: list[tuple[float, int]], run_s: float) -> float:
    """When the limit entered, for the last time, the band around its final value."""
    if not limits:
        return run_s
    final = limits[-1][1]
    band = max(1.0, SETTLE_BAND * final)
    settled, outside = 0.0, False
    for t, limit in limits:
        if abs(limit - final) > band:
            outside = True
        elif outside:
            settled, outside = t, False
    return settled
