"""What the hedging benchmark reads, on loopback (benchmarks/hedging.py) and on a testbed
(benchmarks/_hedging_hosts.py): a block of FANOUT chunks, and batches that read every one at
once, a batch as slow as its slowest read."""

from __future__ import annotations

import asyncio
import os
import time

import xxhash

from blobsdk.chunks.codec import decode_chunk
from blobsdk.sources import ReplicatedBlockStore
from blobsdk.sources.base import new_block_id
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef

CHUNK = 16 << 10
FANOUT = 100


async def write_chunks(blocks: ReplicatedBlockStore) -> list[ChunkRef]:
    """FANOUT chunks of CHUNK random bytes in one new block; their refs."""
    block_id = new_block_id()
    raws = [os.urandom(CHUNK) for _ in range(FANOUT)]
    await blocks.write_block(block_id, raws)
    return [
        ChunkRef(block_id=block_id, offset=i * CHUNK, length=CHUNK, raw_length=CHUNK, checksum=xxhash.xxh3_64_intdigest(raw))
        for i, raw in enumerate(raws)
    ]


async def decode(ref: ChunkRef, stored: memoryview) -> memoryview:
    return decode_chunk(ref, stored)


async def time_batches(tier: L4Tier, refs: list[ChunkRef], count: int) -> list[float]:
    """``count`` batches, each every ref read at once; each batch's seconds (its slowest read's)."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await asyncio.gather(*(tier.fetch(ref, decode) for ref in refs))
        times.append(time.perf_counter() - start)
    return times
