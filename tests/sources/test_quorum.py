"""Writes while a block server is down (issue 20 item 8), against a real local cluster: the
API server and 3 block server processes.  The default write quorum is a majority (2 of 3):
puts go on with one server dead or stopped, and the repairer makes up the missing copy
once it is back; with two down, a put fails and nothing is acknowledged."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

import blobsdk
from blobsdk.config import ClientConfig, RepairConfig, Timeouts, WriteConfig
from blobsdk.errors import BlobNotFound, Unavailable
from blobsdk.ops.repair import Repairer
from blobsdk.sources import ReplicatedBlockStore
from servers.cluster import Cluster, ServerProcess, start_cluster
from servers.cluster import _wait_ready as wait_ready

SMALL = {"chunk_size": 64 << 10, "block_size": 256 << 10}
NO_RETRY = RepairConfig(retry_seconds=3600.0, retry_max_seconds=3600.0)  # passes only when a test calls one
SOCK_READ = 1.0  # how long a write waits on a stopped server before it counts as failed


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=0, trackers=0) as c:
        yield c


def _config(cluster: Cluster) -> ClientConfig:
    assert cluster.config is not None
    return msgspec.structs.replace(
        cluster.config,
        write=WriteConfig(**SMALL),  # write_quorum unset: the default, a majority
        repair=NO_RETRY,
        timeouts=Timeouts(connect=SOCK_READ, sock_read=SOCK_READ),
    )


def _block(cluster: Cluster, i: int) -> ServerProcess:
    return next(p for p in cluster.processes if p.name == f"block-{i}")


def _parts(c: blobsdk.Client) -> tuple[ReplicatedBlockStore, Repairer]:
    store, repairer = c._open.blocks, c._open.repairer
    assert isinstance(store, ReplicatedBlockStore) and repairer is not None
    return store, repairer


async def _restarted(cluster: Cluster, proc: ServerProcess) -> None:
    """Start the dead ``proc`` again on its port; return once it answers /healthz."""
    cluster.restart(proc)
    await asyncio.to_thread(wait_ready, proc, time.monotonic() + 30, 30)


async def _blocks_of(c: blobsdk.Client, paths: list[str]) -> set[str]:
    return {b for p in paths for b in (await c._open.plans.get_plan(p)).block_ids()}


async def _held_by(store: ReplicatedBlockStore, i: int) -> set[str]:
    return {info.block_id async for info in store.replicas[i].list_blocks()}


async def test_puts_go_on_with_a_dead_server_and_its_copies_are_made_up_on_return(cluster: Cluster) -> None:
    dead = _block(cluster, 1)
    dead.popen.kill()
    dead.popen.wait()
    blobs = {f"/q/{i}": os.urandom(100_000 + i) for i in range(8)}
    async with blobsdk.Client(_config(cluster)) as c:
        store, repairer = _parts(c)
        for path, data in blobs.items():
            await c.put(path, data)  # acked by 2 of 3: before, every one failed
        blocks = await _blocks_of(c, list(blobs))
        assert set(store.under_replicated.blocks()) == blocks  # recorded at once, no read needed
        for path, data in blobs.items():
            assert await c.get(path) == data  # refused at once: reads fail over
        assert await repairer.repair_under_replicated() == 0  # still down: nothing to copy to
        assert set(store.under_replicated.blocks()) == blocks  # ...so they stay listed
        await _restarted(cluster, dead)
        assert not blocks & await _held_by(store, 1)
        assert await repairer.repair_under_replicated() == len(blocks)  # one copy each, to block-1
        assert len(store.under_replicated) == 0 and c.stats()["l4"]["under_replicated"] == 0
        sizes = {info.block_id: info.size async for info in store.replicas[0].list_blocks()}
        for block in blocks:
            made_up = await store.replicas[1].read_range(block, 0, sizes[block])
            assert made_up == await store.replicas[0].read_range(block, 0, sizes[block])


async def test_a_stopped_server_holds_no_put_and_its_copy_is_made_up_after(cluster: Cluster) -> None:
    stopped = _block(cluster, 2)
    stopped.popen.send_signal(signal.SIGSTOP)  # its kernel still accepts connections
    try:
        async with blobsdk.Client(_config(cluster)) as c:
            store, repairer = _parts(c)
            data = os.urandom(300_000)
            async with asyncio.timeout(20):  # before the quorum, this put waited on the stopped server
                await c.put("/q/stopped", data)
            blocks = await _blocks_of(c, ["/q/stopped"])
            await store.settle()  # the lagging writes end at their sock_read timeout
            assert set(store.under_replicated.blocks()) == blocks
            stopped.popen.send_signal(signal.SIGCONT)
            assert await repairer.repair_under_replicated() == len(blocks)
            assert len(store.under_replicated) == 0 and blocks <= await _held_by(store, 2)
            assert await c.get("/q/stopped") == data
    finally:
        stopped.popen.send_signal(signal.SIGCONT)


async def test_with_two_of_three_down_a_put_fails_and_nothing_is_acked(cluster: Cluster) -> None:
    dead, stopped = _block(cluster, 0), _block(cluster, 2)
    dead.popen.kill()
    dead.popen.wait()
    stopped.popen.send_signal(signal.SIGSTOP)
    try:
        async with blobsdk.Client(_config(cluster)) as c:
            store, _ = _parts(c)
            with pytest.raises(Unavailable) as info:
                async with asyncio.timeout(20):  # bounded by the stopped server's sock_read
                    await c.put("/q/none", os.urandom(100_000))
            # the dead one refused the connection, the stopped one timed out: grouped, then named
            refused, timed_out = str(info.value).split("; ", 1)
            assert refused == (
                f"a write needs 2 of the 3 block servers and 2 failed: connection refused at {dead.url.removeprefix('http://')}"
                " (nothing listens there: the cluster is down, or client.toml is from an earlier run)"
            )
            assert timed_out.startswith(f"{stopped.url}: TimedOut: PUT {stopped.url}/v1/blocks/")
            stopped.popen.send_signal(signal.SIGCONT)
            with pytest.raises(BlobNotFound):
                await c.stat("/q/none")
            assert len(store.under_replicated) == 0
    finally:
        stopped.popen.send_signal(signal.SIGCONT)
