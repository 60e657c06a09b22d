"""L1: chunks in host memory (a byte-budgeted LRU with optional TTL).

Holds raw bytes that were verified before they were filled; a hit is served without a copy
and without an await.
"""

from __future__ import annotations

import time

from ..cache import MemoryCache
from ..chunks import Demand
from ..runtime import AsyncResource
from ..stats import TierStats
from ..wire import ChunkRef
from .base import Decoder


class L1Tier(AsyncResource):
    """The Tier over a :class:`~blobsdk.cache.MemoryCache`."""

    name = "l1"
    keeps_fetched = True  # its entries are the buffers it serves

    def __init__(self, cache: MemoryCache) -> None:
        self.cache = cache
        self.stats = TierStats()

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """A hit without an await (the read path's fast path); a miss is left to fetch."""
        begun = time.perf_counter()
        data = self.cache.lookup(ref.key)  # a checked plan's ref: its key needs no check
        if data is None:
            return None
        self.stats.hit(len(data), time.perf_counter() - begun)
        return memoryview(data)

    async def fetch(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> memoryview | None:
        raw = self.peek(ref)
        if raw is None:
            self.stats.misses += 1
        return raw

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        self.cache.fill(ref.key, raw)

    def holds(self, ref: ChunkRef) -> bool:
        return self.cache.holds(ref.key)

    async def finds(self, ref: ChunkRef) -> bool:
        """Memory is this process's own: what it holds."""
        return self.holds(ref)

    async def keep(self, ref: ChunkRef, raw: memoryview) -> None:
        """A fill: memory never falls behind."""
        self.cache.fill(ref.key, raw)

    async def flush(self) -> None:
        """Nothing deferred."""

    def extra_stats(self) -> dict[str, int | float]:
        """How full the cache is and what it evicted."""
        cache = self.cache.stats()
        keep = ("entries", "bytes", "capacity_bytes", "evictions")
        return {f"cache_{k}": cache[k] for k in keep}

    async def aclose(self) -> None:
        await self.cache.aclose()
