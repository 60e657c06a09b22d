"""L4: the durable block store, the last tier of the read path.

A chunk's stored bytes are read from each replica of the store in order (the store's
``replicas``), each copy handed to the decoder; the first copy that verifies wins.  Being
the last tier, L4 never misses quietly: when every replica failed it raises CorruptData
(some copy was bad), BlockNotFound (every replica said the block is gone) or Unavailable.
"""

from __future__ import annotations

import time

from ..errors import BlobError, BlockNotFound, CorruptData, Unavailable
from ..sources.base import BlockStore
from ..stats import TierStats
from ..wire import ChunkRef
from .base import BadCopy, Decoder

_FAILOVER = (BlockNotFound, Unavailable, CorruptData)  # about one replica: try the next


class L4Tier:
    """The Tier over a :class:`~blobsdk.sources.base.BlockStore` (not owned: the client
    closes its block store itself)."""

    name = "l4"

    def __init__(self, blocks: BlockStore, stats: TierStats | None = None) -> None:
        self.blocks = blocks
        self.stats = stats if stats is not None else TierStats()

    async def fetch(self, ref: ChunkRef, decode: Decoder) -> memoryview:
        """The verified raw bytes of ``ref`` (never None: L4 raises instead)."""
        return await self.fetch_into(ref, memoryview(bytearray(ref.length)), decode)

    async def fetch_into(self, ref: ChunkRef, buf: memoryview, decode: Decoder) -> memoryview:
        """Like :meth:`fetch`, reading the stored bytes into ``buf`` (exactly ``ref.length``
        bytes).  On return ``buf`` holds the verified stored copy, and the result is the raw
        bytes (``buf`` itself for an uncompressed chunk)."""
        failures: list[BlobError] = []
        for replica in self.blocks.replicas:
            begun = time.perf_counter()
            try:
                await replica.read_into(ref.block_id, ref.offset, buf)
                raw = await decode(ref, buf)
            except _FAILOVER as exc:
                self._count(exc)
                failures.append(exc)
                continue
            self.stats.hit(ref.raw_length, time.perf_counter() - begun)
            return raw
        self.stats.misses += 1
        raise give_up(ref, failures)

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """Nothing to do: L4 is where every chunk comes from."""

    async def aclose(self) -> None:
        """Nothing owned."""

    def _count(self, exc: BlobError) -> None:
        if isinstance(exc, BadCopy):
            self.stats.corrupt += 1
        else:
            self.stats.errors += 1


def give_up(ref: ChunkRef, failures: list[BlobError]) -> BlobError:
    """The error for a chunk no replica could serve, most telling first: a bad copy, then a
    block gone from every replica, else Unavailable."""
    if any(isinstance(f, CorruptData) for f in failures):
        return CorruptData(f"chunk {ref.key}: no replica returned bytes matching its checksum ({failures[-1]})")
    if failures and all(isinstance(f, BlockNotFound) for f in failures):
        return BlockNotFound(f"block {ref.block_id} is gone from every replica (blob deleted or replaced?)")
    last = failures[-1] if failures else "no replicas"
    return Unavailable(f"chunk {ref.key}: every replica failed; last error: {last}")
