"""The hedging benchmark's in-process rows: the client CPU of the L4 tier, its limiters and its
hedger per read, with no network.

Three in-process replicas, each behind its own :class:`~blobsdk.net.limiter.AdaptiveLimiter`
as a block server's data GETs are, answer every read on the next turn of the event loop.  A
batch is 100 reads at once, as in the benchmark.  Rows, per read, in rounds that interleave
them: ``bare`` (a replica's read alone: its limiter and one loop turn), ``none`` and
``hedged`` (the tier with each policy).  Without the kernel's sends and receives (most of a
real read's CPU on this machine), what the SDK's own code costs shows, with a spread of a few
per cent rather than tens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial

from blobsdk.chunks.call import Call
from blobsdk.config import HedgeConfig
from blobsdk.net.limiter import AdaptiveLimiter, LimiterRegistry
from blobsdk.sources.base import new_block_id
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef

READS = 100
ROUNDS = 9


class _Replica:
    """Serves every read on the next turn of the loop, behind its limiter."""

    def __init__(self, name: str, limiter: AdaptiveLimiter) -> None:
        self.name = name
        self.limiter = limiter

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        if call is not None:
            call.queued()
        async with self.limiter.acquire(call.demand if call is not None else None, size=out.nbytes):
            if call is not None:
                call.in_service()
            await asyncio.sleep(0)


class _Blocks:
    def __init__(self, replicas: list[_Replica]) -> None:
        self.replicas = replicas


async def _as_is(ref: ChunkRef, stored: memoryview) -> memoryview:
    return stored


async def client_cpu_in_process(policies: dict[str, HedgeConfig], batches: int) -> dict[str, list[float]]:
    """Client CPU-µs per read of each row, one value per round."""
    limiters = LimiterRegistry()
    replicas = [_Replica(f"http://replica-{i}", limiters.get(f"http://replica-{i}")) for i in range(3)]
    block_id = new_block_id()
    refs = [ChunkRef(block_id=block_id, offset=i << 14, length=1 << 14, raw_length=1 << 14, checksum=0) for i in range(READS)]
    buffer = memoryview(bytearray(1 << 14))

    async def bare(ref: ChunkRef) -> None:
        await replicas[(ref.offset >> 14) % 3].read_into(ref.block_id, ref.offset, buffer)

    rows: dict[str, Callable[[ChunkRef], Awaitable[object]]] = {"bare": bare}
    for name in ("none", "hedged"):
        tier = L4Tier(ReplicaReader(_Blocks(replicas), hedge=policies[name], limiters=limiters))  # type: ignore[arg-type]
        rows[name] = partial(tier.fetch, decode=_as_is)
    rounds: dict[str, list[float]] = {name: [] for name in rows}
    for read in rows.values():  # warm the limiters and the latency estimates
        await _batches(read, refs, 20)
    for _ in range(ROUNDS):
        for name, read in rows.items():
            begun = time.process_time()
            await _batches(read, refs, batches)
            rounds[name].append((time.process_time() - begun) / (batches * READS) * 1e6)
    return rounds


async def _batches(read: Callable[[ChunkRef], Awaitable[object]], refs: list[ChunkRef], count: int) -> None:
    for _ in range(count):
        await asyncio.gather(*(read(ref) for ref in refs))
