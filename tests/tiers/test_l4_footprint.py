"""What an L4 read keeps alive while it is in flight, counted in objects the cyclic garbage
collector tracks.  A batch of 100 reads keeps 100 times that alive at once, and every 700
of them set off a collection (a full one, of the whole process, once enough have lived
through two): on the hedging benchmark's client that was ~16 µs of a read's ~35-50 µs of
CPU.  Counted, not timed: the same on any machine."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest

from blobsdk.chunks.call import Call
from blobsdk.config import HedgeConfig
from blobsdk.net.limiter import AdaptiveLimiter, LimiterRegistry
from blobsdk.tail.hedge import Hedger
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef

READS = 100


class _Replica:
    """Answers once ``gate`` is set, behind its limiter, as a block server's GET does."""

    def __init__(self, name: str, limiter: AdaptiveLimiter, gate: asyncio.Event) -> None:
        self.name = name
        self.limiter = limiter
        self.gate = gate

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        if call is not None:
            call.queued()
        async with self.limiter.acquire(call.demand if call is not None else None, size=out.nbytes):
            if call is not None:
                call.in_service()
            await self.gate.wait()


class _Blocks:
    def __init__(self, replicas: list[_Replica]) -> None:
        self.replicas = replicas


async def _as_is(ref: ChunkRef, stored: memoryview) -> memoryview:
    return stored


async def _tracked_per_read(config: HedgeConfig) -> float:
    """Objects the collector tracks, per read, while a batch of reads waits at its replicas
    (after warm-up batches: the limiters, estimates and buffers are made)."""
    gate = asyncio.Event()
    limiters = LimiterRegistry()
    replicas = [_Replica(f"http://replica-{i}", limiters.get(f"http://replica-{i}"), gate) for i in range(3)]
    tier = L4Tier(ReplicaReader(_Blocks(replicas), hedge=config, limiters=limiters))  # type: ignore[arg-type]
    refs = [ChunkRef(block_id="0" * 32, offset=i << 10, length=1 << 10, raw_length=1 << 10, checksum=0) for i in range(READS)]
    gate.set()
    for _ in range(5):
        await asyncio.gather(*(tier.fetch(ref, _as_is) for ref in refs))
    gate.clear()
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        batch = asyncio.gather(*(tier.fetch(ref, _as_is) for ref in refs))
        for _ in range(5):  # every read reaches its replica (or its limiter's queue)
            await asyncio.sleep(0)
        during = len(gc.get_objects())
        gate.set()
        await batch
    finally:
        gc.enable()
    return (during - before) / READS


@pytest.mark.parametrize(
    ("policy", "config", "most"),
    [
        # With gather's own task per read (~7 objects) counted too.  Now 19.7 and 24.6; were
        # 28.4 and 40.6: a partial, a bound method and a list per read for the tier's attempt
        # function, its ``ready`` bound anew, a demand's watcher list, a limiter's watcher
        # closure for foreground reads (never promoted), and the race's four empty sets and
        # lists, a tuple, a partial of the target's ``answered``.
        ("none", HedgeConfig(enabled=False), 22),
        ("hedged", HedgeConfig(max_parallel=3), 27),
    ],
)
async def test_a_read_in_flight_keeps_few_objects_for_the_collector(policy: str, config: HedgeConfig, most: int) -> None:
    assert await _tracked_per_read(config) <= most


def test_the_hedger_makes_each_targets_answered_callback_once_and_keeps_a_bounded_number() -> None:
    now = [100.0]

    def clock() -> float:
        return now[0]

    hedger = Hedger(HedgeConfig(), clock=clock)
    answered: Callable[[], None] = hedger.answered_of("a")
    assert hedger.answered_of("a") is answered and hedger.answered_of("b") is not answered
    assert hedger.health.silent_for("a", 1.0)
    answered()
    assert not hedger.health.silent_for("a", 1.0)  # it is the target's health.answered
    for i in range(5000):  # peers come and go: the callbacks kept stay bounded
        hedger.answered_of(f"peer-{i}")
    assert len(hedger._answered) <= 1024
