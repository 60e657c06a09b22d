"""Tail-latency faults against a real cluster: stalled, corrupt, failing and overloaded
block servers (faults switched on per server through /admin/faults)."""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import msgspec
import pytest

import blobsdk
from blobsdk.chunks import rank
from blobsdk.config import HedgeConfig, L1Config, Timeouts, WriteConfig
from blobsdk.sources import ReplicatedBlockStore
from servers.cluster import start_cluster

ADMIN = "admin-secret"
SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)
DEADLINE = Timeouts(connect=2.0, sock_read=3.0, total=30.0)


def _config(cluster) -> blobsdk.ClientConfig:
    return msgspec.structs.replace(cluster.config, write=SMALL, l1=L1Config(capacity_bytes=0), timeouts=DEADLINE)


async def _set_faults(url: str, *rules: dict) -> None:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with session.put(f"{url}/admin/faults", json={"rules": list(rules), "seed": 7}, headers=headers) as resp:
            assert resp.status == 200, await resp.text()


@pytest.fixture
async def cluster(tmp_path):
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=0, admin_token=ADMIN, trackers=0) as cluster:
        yield cluster


async def _put(cluster, size: int = 640 << 10) -> bytes:
    data = os.urandom(size)
    async with blobsdk.Client(_config(cluster)) as c:
        await c.put("/b/x", data)
    return data


async def _first_replica(cluster) -> str:
    """The block server tried first for the blob's first chunk (rendezvous order)."""
    async with blobsdk.Client(_config(cluster)) as c:
        key = (await c._open.plans.get_plan("/b/x")).chunks[0].key
    return rank(key, list(cluster.config.block_urls))[0]


async def test_a_stalled_replica_never_stalls_a_read(cluster):
    data = await _put(cluster)
    await _set_faults(await _first_replica(cluster), {"route": "/v1/blocks", "methods": ["GET"], "stall_rate": 1.0})
    async with blobsdk.Client(_config(cluster)) as c:
        begun = time.perf_counter()
        assert await c.get("/b/x") == data  # 10 chunks: about a third have the stalled replica first
        assert time.perf_counter() - begun < DEADLINE.sock_read  # hedged away, not timed out
        l4 = c.stats()["l4"]  # a hedge, or under load the hang deadline first (blobsdk/tail/health.py)
        assert l4["hedge_hedges_sent"] + l4["hedge_hung_failovers"] >= 1


async def test_a_corrupting_replica_is_never_returned(cluster):
    data = await _put(cluster)
    await _set_faults(await _first_replica(cluster), {"route": "/v1/blocks", "methods": ["GET"], "corrupt_rate": 1.0})
    async with blobsdk.Client(_config(cluster)) as c:
        for _ in range(3):
            assert await c.get("/b/x") == data
        assert c.stats()["l4"]["corrupt"] >= 1


async def test_every_replica_failing_is_unavailable_within_the_deadline(cluster):
    await _put(cluster)
    for url in cluster.config.block_urls:
        await _set_faults(url, {"route": "/v1/blocks", "methods": ["GET"], "error_rate": 1.0})
    async with blobsdk.Client(_config(cluster)) as c:
        begun = time.perf_counter()
        with pytest.raises(blobsdk.Unavailable):
            await c.get("/b/x")
        assert time.perf_counter() - begun < 2.0


async def test_cancelling_a_stalled_read_leaves_nothing_behind(cluster):
    await _put(cluster)
    for url in cluster.config.block_urls:
        await _set_faults(url, {"route": "/v1/blocks", "methods": ["GET"], "stall_rate": 1.0})
    async with blobsdk.Client(_config(cluster)) as c:
        before = asyncio.all_tasks()
        read = asyncio.create_task(c.get("/b/x"))
        await asyncio.sleep(0.3)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        for _ in range(50):  # the fetches unwind as their cancellations arrive
            if not asyncio.all_tasks() - before - {asyncio.current_task()}:
                break
            await asyncio.sleep(0.01)
        assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
    # leaving the client closed its session: an unclosed one would fail this test (warnings are errors)


async def test_an_overloaded_server_makes_the_limiter_back_off_and_goodput_recover(tmp_path):
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=0, admin_token=ADMIN, trackers=0) as cluster:
        blobs = {f"/b/{i}": os.urandom(60_000) for i in range(64)}
        async with blobsdk.Client(_config(cluster)) as c:
            await c.put_many(blobs.items())
        await _set_faults(
            cluster.config.block_urls[0],
            {
                "route": "/v1/blocks",
                "methods": ["GET"],
                "max_in_service": 2,
                "queue_limit": 2,
                "overload": "reject",
                "latency_ms": 20,
            },
        )
        async with blobsdk.Client(_config(cluster)) as c:
            url = cluster.config.block_urls[0]
            first = await asyncio.gather(*(c.get(p) for p in blobs), return_exceptions=True)
            rejected = sum(isinstance(r, blobsdk.Unavailable) for r in first)
            assert rejected > 0 and c.stats()["limits"][url] < 16  # backed off from its initial 16
            second = await asyncio.gather(*(c.get(p) for p in blobs), return_exceptions=True)
            failed = sum(isinstance(r, BaseException) for r in second)
            answered = [(p, r) for p, r in zip(blobs, second, strict=True) if not isinstance(r, BaseException)]
            assert failed < rejected and all(r == blobs[p] for p, r in answered)


# A read that waits for its socket's timeout takes >= 30 s, one the hang deadline catches
# <= 1 s plus the failed-over read: the tests' bound (8 s) holds on a loaded machine (2.5 s was
# seen under a CI run beside three busy processes) and still tells the two apart.
HANG_TIMEOUTS = Timeouts(connect=2.0, sock_read=30.0, total=60.0)
HANG_BOUND_S = 8.0


async def _readers_through_a_hang(
    cluster, hung_url: str, hedge: HedgeConfig, *, readers: int = 16, seconds: float = 4.0
) -> tuple[list[float], dict[str, int | float]]:
    """``readers`` tasks read 1 MiB blobs in a loop for ``seconds``; ``hung_url`` stops
    answering (accepts, never replies) a second in.  Every read's latency; every byte checked."""
    blobs = {f"/b/h{i}": os.urandom(1 << 20) for i in range(24)}
    timeouts = HANG_TIMEOUTS
    config = msgspec.structs.replace(_config(cluster), timeouts=timeouts, hedge=hedge)
    async with blobsdk.Client(config) as c:
        await c.put_many(blobs.items())
        # Reads in steady state: a majority acked each block, so the third copies may still be
        # uploading; replicas busy receiving them answered slowly enough, once in a fresh-clone
        # run, to be taken for hung too.
        blocks = c._open.blocks
        assert isinstance(blocks, ReplicatedBlockStore)
        await blocks.settle()
        latencies: list[float] = []
        stop = time.perf_counter() + seconds

        async def reader(i: int) -> None:
            paths = list(blobs)
            while time.perf_counter() < stop:
                path = paths[i % len(paths)]
                i += 1
                begun = time.perf_counter()
                assert await c.get(path) == blobs[path]
                latencies.append(time.perf_counter() - begun)

        async def hang() -> None:
            await asyncio.sleep(1.0)
            await _set_faults(hung_url, {"route": "/v1/blocks", "methods": ["GET"], "stall_rate": 1.0})

        await asyncio.gather(hang(), *(reader(i * 5) for i in range(readers)))
        stats = c.stats()["l4"]
    return latencies, stats


NO_BUDGET = HedgeConfig(budget_burst=0, budget_ratio=0)  # no hedge at all: only hang detection helps


@pytest.mark.parametrize("hedge", [HedgeConfig(), NO_BUDGET], ids=["default", "no_hedge_budget"])
async def test_a_hung_replica_never_stalls_sixteen_readers(cluster, hedge):
    """A replica that accepts but never answers is a failure, not a straggler: its reads fail
    over to the healthy replicas within about a second, whatever the hedge budget has left."""
    latencies, stats = await _readers_through_a_hang(cluster, cluster.config.block_urls[1], hedge)
    # At most the hang deadline (<= 1 s) after the replica's last answer (its reads in flight
    # when it stalled still finish), plus the failed-over read, not the socket's 30 s timeout.
    assert max(latencies) < HANG_BOUND_S, (sorted(latencies)[-5:], len(latencies), dict(sorted(stats.items())))
    if hedge is NO_BUDGET:
        # The stalled replica is taken for hung; on a loaded machine a healthy one that is slow
        # past the hang deadline (0.5-1 s) may be too, for a while (seen: 2 of 3).
        assert stats["hedge_hung_failovers"] >= 1 and stats["hedge_targets_hung"] >= 1, sorted(stats.items())
        assert stats["hedge_hedges_sent"] == 0


async def test_a_hung_l3_node_never_stalls_readers(tmp_path):
    """The same for an L3 node: its reads go to the other node (or L4) within about a second."""
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=2, admin_token=ADMIN, trackers=0) as cluster:
        blobs = {f"/b/n{i}": os.urandom(1 << 20) for i in range(16)}
        config = msgspec.structs.replace(_config(cluster), timeouts=HANG_TIMEOUTS, hedge=NO_BUDGET)
        async with blobsdk.Client(config) as c:
            await c.put_many(blobs.items())
            for path in blobs:  # warm the nodes
                await c.get(path)
            await _set_faults(cluster.config.l3_urls[0], {"route": "/v1/chunks", "methods": ["GET"], "stall_rate": 1.0})
            worst = 0.0
            for _ in range(2):
                for path, data in blobs.items():
                    begun = time.perf_counter()
                    assert await c.get(path) == data
                    worst = max(worst, time.perf_counter() - begun)
            stats = c.stats()["l3"]
    assert worst < HANG_BOUND_S, (worst, sorted(stats.items()))
    assert stats["hedge_hung_failovers"] >= 1 and stats["hedge_targets_hung"] == 1, sorted(stats.items())
