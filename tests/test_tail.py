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
from blobsdk.config import L1Config, Timeouts, WriteConfig
from blobsdk.placement import rank
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
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=0, admin_token=ADMIN) as cluster:
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
        assert c.stats()["l4"]["hedge_hedges_sent"] >= 1


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
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=0, admin_token=ADMIN) as cluster:
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
