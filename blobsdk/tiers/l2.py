"""L2: chunks on local flash, filled write-behind.

Fills go through a bounded queue drained by a few owned tasks, so a slow or full disk never
slows a read: when the queue is full the fill is dropped (and counted).  Reads are verified
against the chunk checksum (DESIGN invariant 1: L2 disk -> memory is a tier boundary): the
engine checks its file's recorded checksum equals the chunk's and hashes the bytes it read,
on its own threads.
"""

from __future__ import annotations

import asyncio
import time

from ..cache.disk import DiskCache
from ..errors import BlobError
from ..stats import TierStats
from ..wire import ChunkRef
from .base import Decoder

_QUEUE_BYTES = 256 << 20  # fills waiting for the disk; past this they are dropped
_WRITERS = 4  # fills written at once (the disk engine has as many threads)


class L2Tier:
    """The Tier over a :class:`~blobsdk.cache.disk.DiskCache`; owns its write-behind task."""

    name = "l2"

    def __init__(self, cache: DiskCache, *, queue_bytes: int = _QUEUE_BYTES, writers: int = _WRITERS) -> None:
        self.cache = cache
        self.stats = TierStats()
        self.fills_dropped = 0
        self._queue: asyncio.Queue[tuple[str, memoryview]] = asyncio.Queue()
        self._queue_bytes = queue_bytes
        self._pending_bytes = 0  # bounded by bytes, not entries: fills arrive in bursts
        loop = asyncio.get_running_loop()
        self._writers = [loop.create_task(self._drain()) for _ in range(writers)]

    async def fetch(self, ref: ChunkRef, decode: Decoder) -> memoryview | None:
        begun = time.perf_counter()
        corrupt_before = self.cache.stats()["corrupt"]
        data = await self.cache.get(ref.key, checksum=ref.checksum)  # verified on the executor
        if data is None:
            self.stats.misses += 1
            self.stats.corrupt += self.cache.stats()["corrupt"] - corrupt_before
            return None
        self.stats.hit(len(data), time.perf_counter() - begun)
        return memoryview(data)

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        if self._pending_bytes + raw.nbytes > self._queue_bytes:
            self.fills_dropped += 1
            return
        self._pending_bytes += raw.nbytes
        self._queue.put_nowait((ref.key, raw))

    async def flush(self) -> None:
        """Wait until every queued fill was written (tests and benchmarks)."""
        await self._queue.join()

    def extra_stats(self) -> dict[str, int | float]:
        """How full the cache is and what it evicted."""
        cache = self.cache.stats()
        keep = ("entries", "bytes", "capacity_bytes", "evictions")
        return {"fills_dropped": self.fills_dropped, **{f"cache_{k}": cache[k] for k in keep}}

    async def aclose(self) -> None:
        for writer in self._writers:
            writer.cancel()
        await asyncio.gather(*self._writers, return_exceptions=True)
        await self.cache.aclose()

    async def _drain(self) -> None:
        while True:
            key, raw = await self._queue.get()
            try:
                if not await self.cache.put(key, raw):
                    self.fills_dropped += 1
            except BlobError:  # e.g. QuotaExceeded: a cache that cannot store is only a miss
                self.stats.errors += 1
            finally:
                self._pending_bytes -= raw.nbytes
                self._queue.task_done()
