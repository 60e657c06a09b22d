"""L1: chunks in host memory (a byte-budgeted LRU with optional TTL).

Holds raw bytes that were verified before they were filled; a hit is served without a copy
and without an await.
"""

from __future__ import annotations

import time

from ..cache.memory import MemoryCache
from ..stats import TierStats
from ..wire import ChunkRef
from .base import Decoder


class L1Tier:
    """The Tier over a :class:`~blobsdk.cache.memory.MemoryCache`."""

    name = "l1"

    def __init__(self, cache: MemoryCache) -> None:
        self.cache = cache
        self.stats = TierStats()

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """A synchronous lookup: the read path's fast path."""
        begun = time.perf_counter()
        data = self.cache.get_nowait(ref.key)
        if data is None:
            self.stats.misses += 1
            return None
        self.stats.hit(len(data), time.perf_counter() - begun)
        return memoryview(data)

    async def fetch(self, ref: ChunkRef, decode: Decoder) -> memoryview | None:
        return self.peek(ref)

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        self.cache.put_nowait(ref.key, raw)

    async def flush(self) -> None:
        """Nothing deferred."""

    def extra_stats(self) -> dict[str, int | float]:
        """How full the cache is and what it evicted."""
        cache = self.cache.stats()
        keep = ("entries", "bytes", "capacity_bytes", "evictions")
        return {**{f"cache_{k}": cache[k] for k in keep}}

    async def aclose(self) -> None:
        await self.cache.aclose()
