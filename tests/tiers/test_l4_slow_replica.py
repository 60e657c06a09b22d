"""Hedging never hurts: against one slow replica, hedged L4 reads are at most as slow at p99
as plain failover.  In-process replicas with fixed service times behind client-side limits,
on an event loop whose clock is virtual (it jumps to the next timer instead of sleeping), so
every batch takes the same virtual time on any machine: the figures are exact, not timed.

What broke it once: a hedged read ran its primary attempt in a task of its own, which first
ran after every read of the batch had been ranked, so the tier's least-loaded order saw all
replicas idle and the batch split by hash alone (unevenly, queueing longer at one replica);
plain failover ranked each read after the previous ones had taken their slots."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import xxhash

from blobsdk.chunks.call import Call
from blobsdk.chunks.codec import decode_chunk
from blobsdk.config import HedgeConfig, LimiterConfig
from blobsdk.net.limiter import AdaptiveLimiter, LimiterRegistry
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.wire import ChunkRef

T = TypeVar("T")
CHUNK = 1024
FANOUT = 100  # reads per batch, as a training step's samples
SEEK = 0.001  # a read's service time at a fast replica, and a slow link's before its bytes


class _Selector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Never blocks: with nothing ready, it moves its loop's virtual clock by the timeout."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if not events and timeout is not None:
            self.loop.now += timeout
        elif not events:
            raise RuntimeError("nothing ready and no timer: the test would hang")
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


class FakeReplica:
    """A replica that serves every read in ``seconds`` of (virtual) time, behind its limiter
    as a block server's data GETs are (the attempt is queued, then in service)."""

    def __init__(self, name: str, limiter: AdaptiveLimiter, seconds: float, data: bytes) -> None:
        self.name = name
        self.limiter = limiter
        self.seconds = seconds
        self.data = data
        self.served = 0

    @property
    def replicas(self) -> tuple[FakeReplica]:
        return (self,)

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        call = call if call is not None else Call()
        call.queued()
        async with self.limiter.acquire(call.demand, size=len(out)):
            call.in_service()
            await asyncio.sleep(self.seconds)
            out[:] = self.data[offset : offset + len(out)]
            self.served += 1

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


class LinkReplica(FakeReplica):
    """A replica behind a slow link: after ``SEEK`` of service, each read's bytes take
    ``seconds`` on the wire, one read after another (a token bucket's queue), so the reads
    in flight there wait for those sent before them."""

    def __init__(self, name: str, limiter: AdaptiveLimiter, seconds: float, data: bytes) -> None:
        super().__init__(name, limiter, seconds, data)
        self.wire = asyncio.Lock()

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        call = call if call is not None else Call()
        call.queued()
        async with self.limiter.acquire(call.demand, size=len(out)):
            call.in_service()
            await asyncio.sleep(SEEK)
            async with self.wire:
                await asyncio.sleep(self.seconds)
            out[:] = self.data[offset : offset + len(out)]
            self.served += 1


class FixedLimits(LimiterRegistry):
    """A fixed in-flight limit per endpoint (a registry's limiters share one config)."""

    def __init__(self, limits: dict[str, int], clock: Callable[[], float]) -> None:
        super().__init__(clock=clock)
        self.made = {
            name: AdaptiveLimiter(name, LimiterConfig(initial=n, min_limit=n, max_limit=n), clock=clock)
            for name, n in limits.items()
        }

    def get(self, endpoint: str, *, by_latency: bool = True) -> AdaptiveLimiter:
        return self.made[endpoint]

    def load(self, endpoint: str) -> int:
        return self.made[endpoint].in_flight + self.made[endpoint].queued

    def limit(self, endpoint: str) -> int:
        return self.made[endpoint].limit

    def has_room(self, endpoint: str) -> bool:
        return self.made[endpoint].has_room


class Replicas:
    def __init__(self, replicas: list[FakeReplica]) -> None:
        self.replicas = tuple(replicas)


async def _decode(ref: ChunkRef, stored: memoryview) -> memoryview:
    return decode_chunk(ref, stored)


async def batch_p99(
    policy: HedgeConfig,
    seconds: list[float],
    warm: int = 20,
    batches: int = 60,
    *,
    link: bool = False,
    limits: list[int] | None = None,
) -> float:
    """The p99 batch latency (virtual seconds) of ``batches`` batches of FANOUT reads;
    ``link``: the first replica is a :class:`LinkReplica`; ``limits``: each replica's fixed
    in-flight limit (default: 4 each)."""
    loop = asyncio.get_running_loop()
    raws = [bytes([i]) * CHUNK for i in range(FANOUT)]
    data = b"".join(raws)
    block = "5" * 32
    refs = [
        ChunkRef(block_id=block, offset=i * CHUNK, length=CHUNK, raw_length=CHUNK, checksum=xxhash.xxh3_64_intdigest(raw))
        for i, raw in enumerate(raws)
    ]
    names = [f"http://r{i}" for i in range(len(seconds))]
    limiters = FixedLimits(dict(zip(names, limits or [4] * len(names), strict=True)), loop.time)
    kinds = [LinkReplica if link and i == 0 else FakeReplica for i in range(len(names))]
    replicas = [kind(name, limiters.get(name), s, data) for kind, name, s in zip(kinds, names, seconds, strict=True)]
    tier = L4Tier(ReplicaReader(Replicas(replicas), hedge=policy, limiters=limiters, clock=loop.time))  # type: ignore[arg-type]
    times = []
    for n in range(warm + batches):
        begun = loop.time()
        got = await asyncio.gather(*(tier.fetch(ref, _decode) for ref in refs))
        assert [bytes(g) for g in got] == raws
        if n >= warm:
            times.append(loop.time() - begun)
    return sorted(times)[int(0.99 * len(times))]


NONE = HedgeConfig(enabled=False)
HEDGED = HedgeConfig(max_parallel=3)  # the hedging benchmark's policy


def test_the_virtual_clock_is_exact() -> None:
    async def sleeps() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(asyncio.sleep(s) for s in (0.5, 3.0, 1.25)))
        return loop.time()

    assert run_virtual(sleeps()) == 3.0


def test_hedged_reads_are_no_slower_at_p99_than_plain_failover_against_one_slow_replica() -> None:
    slow_one = [0.010, 0.001, 0.001]  # one replica 10x slower, as benchmarks/hedging.py's slow_replica
    none, hedged = run_virtual(batch_p99(NONE, slow_one)), run_virtual(batch_p99(HEDGED, slow_one))
    assert hedged <= none, f"hedged p99 {hedged * 1000:.1f} ms > plain failover's {none * 1000:.1f} ms"


def test_hedged_reads_cost_nothing_at_p99_without_a_fault() -> None:
    even = [0.001, 0.001, 0.001]
    none, hedged = run_virtual(batch_p99(NONE, even)), run_virtual(batch_p99(HEDGED, even))
    assert hedged <= none, f"hedged p99 {hedged * 1000:.1f} ms > plain failover's {none * 1000:.1f} ms"


def test_a_replica_slow_on_the_wire_is_hedged_at_the_next_replicas_pace() -> None:
    """Its p95 is as slow as its reads, so hedging at its own p95 hedged none of them: a read
    there is raced once the replica next in line would have answered (its p95)."""
    wire = [0.0066, SEEK, SEEK]  # 16 KiB at 20 Mbit/s; each read waits for those before it
    none = run_virtual(batch_p99(NONE, wire, link=True))
    hedged = run_virtual(batch_p99(HEDGED, wire, link=True))
    assert hedged <= none / 2, f"hedged p99 {hedged * 1000:.1f} ms > half plain failover's {none * 1000:.1f} ms"


def test_a_replica_of_lower_throughput_gets_its_share_by_throughput() -> None:
    """Ranked by (load + 1) x latency, as if every replica served one read at a time, a slow
    link's replica (limit 4) got a batch's reads as a server 4x its latency would, though the
    fast ones (limit 16) serve 16 at once: plain failover's p99 was 10x its fault-free one.
    Ranked by (load + 1) x latency / limit, it is within 2x."""
    limits = [4, 16, 16]
    slow = run_virtual(batch_p99(NONE, [0.0066, SEEK, SEEK], link=True, limits=limits))
    even = run_virtual(batch_p99(NONE, [SEEK] * 3, limits=limits))
    assert slow <= 2 * even, f"p99 {slow * 1000:.1f} ms with a slow link vs {even * 1000:.1f} ms without"
