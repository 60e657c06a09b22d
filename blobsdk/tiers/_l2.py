"""L2: chunks on local flash, filled write-behind.

Fills go through a bounded queue drained by a few owned tasks, so a slow or full disk never
slows a read: when the queue is full the fill is dropped (and counted).  Reads are verified
against the chunk checksum (DESIGN invariant 1: L2 disk -> memory is a tier boundary): the
engine checks its file's recorded checksum equals the chunk's and hashes the bytes it read,
on its own threads.

The writers start when the tier is entered (``async with``) and stop when it is closed.  A
fill that fails, whatever the error, is counted in ``errors`` and dropped, and the writer
goes on, so ``flush`` never waits for a writer that died; a failure that is not a BlobError
(a bug, an OSError; a BlobError such as QuotaExceeded is the cache refusing, as expected)
is also logged with its traceback and counted in ``fill_failures``.  ``corrupt`` is the
cache's count of damaged copies it dropped (found on a read or when it opened).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AsyncExitStack

from ..cache import DiskCache
from ..chunks import Demand
from ..errors import BlobError
from ..runtime import AsyncResource
from ..stats import TierStats
from ..wire import ChunkRef
from .base import Decoder

_QUEUE_BYTES = 256 << 20  # fills waiting for the disk; past this they are dropped
_WRITERS = 4  # fills written at once (the disk engine has as many threads)

log = logging.getLogger(__name__)


class L2Tier(AsyncResource):
    """The Tier over a :class:`~blobsdk.cache.DiskCache`, which it owns (entered and
    closed with the tier), with its write-behind writers."""

    name = "l2"
    keeps_fetched = False  # each fetch reads into a new buffer

    def __init__(self, cache: DiskCache, *, queue_bytes: int = _QUEUE_BYTES, writers: int = _WRITERS) -> None:
        self.cache = cache
        self.stats = TierStats()
        self.fills_dropped = 0
        self.fill_failures = 0  # fills that failed with an unexpected error (logged)
        self._queue: asyncio.Queue[tuple[str, memoryview]] = asyncio.Queue()
        self._queue_bytes = queue_bytes
        self._pending_bytes = 0  # bounded by bytes, not entries: fills arrive in bursts
        self._writer_count = writers
        self._writers: list[asyncio.Task[None]] = []
        self._stack = AsyncExitStack()  # the cache, once entered

    async def _start(self) -> None:
        await self._stack.enter_async_context(self.cache)
        self._writers = [asyncio.create_task(self._drain(), name=f"l2-writer-{i}") for i in range(self._writer_count)]

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """Nothing without a disk read: ask fetch."""
        return None

    async def fetch(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> memoryview | None:
        begun = time.perf_counter()
        data = await self.cache.get(ref.key, checksum=ref.checksum, length=ref.raw_length)  # verified on the executor
        if data is None:
            self.stats.misses += 1
            # The cache is this tier's alone: its count is the tier's (a before/after delta
            # would also count what concurrent fetches found).
            self.stats.corrupt = int(self.cache.stats()["corrupt"])
            return None
        self.stats.hit(len(data), time.perf_counter() - begun)
        return memoryview(data)

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        if not self._writers or self._pending_bytes + raw.nbytes > self._queue_bytes:
            self.fills_dropped += 1  # not open, or the disk is behind
            return
        self._pending_bytes += raw.nbytes
        self._queue.put_nowait((ref.key, raw))

    async def flush(self) -> None:
        """Wait until every queued fill was written (tests and benchmarks)."""
        await self._queue.join()

    def holds(self, ref: ChunkRef) -> bool:
        return self.cache.contains(ref.key)

    async def finds(self, ref: ChunkRef) -> bool:
        """Also a file another process sharing the directory wrote (its header checked)."""
        return await self.cache.find(ref.key, checksum=ref.checksum, length=ref.raw_length)

    async def keep(self, ref: ChunkRef, raw: memoryview) -> None:
        """Write now, past the write-behind queue (which may drop): a prefetch waits for the disk."""
        await self._write(ref.key, raw)

    def extra_stats(self) -> dict[str, int | float]:
        """How full the cache is and what it evicted."""
        cache = self.cache.stats()
        keep = ("entries", "bytes", "capacity_bytes", "evictions")
        return {
            "fills_dropped": self.fills_dropped,
            "fill_failures": self.fill_failures,
            **{f"cache_{k}": cache[k] for k in keep},
        }

    async def aclose(self) -> None:
        """Stop the writers (queued fills are dropped) and close the cache; idempotent."""
        writers, self._writers = self._writers, []
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        while not self._queue.empty():  # dropped: flush() must not wait for them
            _, raw = self._queue.get_nowait()
            self._pending_bytes -= raw.nbytes
            self.fills_dropped += 1
            self._queue.task_done()
        await self._stack.aclose()

    async def _drain(self) -> None:
        while True:
            key, raw = await self._queue.get()
            try:
                await self._write(key, raw)
            finally:
                self._pending_bytes -= raw.nbytes
                self._queue.task_done()

    async def _write(self, key: str, raw: memoryview) -> None:
        """One fill; a failure is counted and logged, never fatal to the writer."""
        try:
            if not await self.cache.put(key, raw):
                self.fills_dropped += 1
        except BlobError:  # e.g. QuotaExceeded: a cache that cannot store is only a miss
            self.stats.errors += 1
        except Exception:  # a bug or an OS error: the writer must live on, or flush() hangs
            self.stats.errors += 1
            self.fill_failures += 1
            log.exception("L2 fill of chunk %s failed", key)
