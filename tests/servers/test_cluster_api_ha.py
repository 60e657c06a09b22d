"""``blobsdk-cluster --api-servers N`` (servers/cluster.py, servers/clusterplan.py): several
API servers over one Redis, the cluster's own (``--metadata redis``: a primary, its replica
and three Sentinels) or one given; client.toml lists them all in ``api_urls``.  With the
cluster's own, neither an API server nor the Redis primary is a single point of failure."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import blobsdk
from blobsdk.metadata import RedisMetadataStore
from servers.cluster import ClusterOptions, parse_args, start_cluster
from servers.redisd import sentinel_url

from ..helpers import until

ROOT = Path(__file__).resolve().parent.parent.parent
FAILOVER_BOUND_S = 30.0  # the Sentinels call the primary down after 1 s, then elect and promote
SMALL = {"block_servers": 1, "l3_nodes": 0, "trackers": 0, "startup_timeout": 120.0}  # a loaded machine starts slowly


def replication(port: int, host: str = "127.0.0.1") -> str:
    argv = ["redis-cli", "-h", host, "-p", str(port), "info", "replication"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    return done.stdout


async def replicated(store: RedisMetadataStore, path: str, *, version: int) -> bool:
    """Whether ``path`` reaches ``version`` on the replica (replication is asynchronous)."""
    for _ in range(600):
        (plan,) = await store.get_plans([path])
        if plan is not None and plan.version == version:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_two_api_servers_over_the_clusters_redis_and_its_replica(tmp_path):
    async with start_cluster(tmp_path / "c", metadata="redis", api_servers=2, **SMALL) as cluster:
        _, replica = cluster.redis
        apis = [p for p in cluster.processes if p.kind == "api"]
        assert [p.name for p in apis] == ["api-0", "api-1"]
        assert cluster.config is not None and cluster.config.api_urls == tuple(p.url for p in apis)
        assert cluster.config.api_url is None
        assert f"--metadata {sentinel_url(cluster.sentinels)}" in " ".join(apis[0].args)
        async with blobsdk.Client(cluster.config) as client:
            await client.put("/b/k", b"x" * 100)
            apis[0].popen.kill()
            apis[0].popen.wait()
            await client.put("/b/k", b"y" * 100)  # api-1 takes it
            assert await client.get("/b/k") == b"y" * 100
        until(lambda: "master_link_status:up" in replication(replica.port), timeout=30)
        async with RedisMetadataStore(replica.url) as on_replica:
            assert await replicated(on_replica, "/b/k", version=2)
    assert cluster.redis == [] and cluster.sentinels == []  # stopped with the cluster


async def test_the_clusters_sentinels_fail_its_redis_over_under_running_puts(tmp_path):
    async with start_cluster(tmp_path / "c", metadata="redis", api_servers=2, **SMALL) as cluster:
        primary, replica = cluster.redis
        until(lambda: all(knows_replica_and_peers(s, len(cluster.sentinels)) for s in cluster.sentinels), timeout=60)
        async with blobsdk.Client(cluster.config) as client:
            acked = {f"/b/k{i}": os.urandom(1000 + i) for i in range(5)}
            for path, data in acked.items():
                await client.put(path, data)
            until(lambda: replica_offset_caught_up(primary.port), timeout=30)
            primary.stop()
            acked["/b/after"] = os.urandom(2000)
            await put_until_served(client, "/b/after", acked["/b/after"])
            for path, data in acked.items():
                assert await client.get(path) == data, path
        assert "role:master" in replication(replica.port)


def knows_replica_and_peers(sentinel, count: int) -> bool:
    """``sentinel`` has learnt of the replica and the other Sentinels: a majority can promote."""
    argv = ["redis-cli", "-h", sentinel.address, "-p", str(sentinel.port), "sentinel", "master", "blobsdk"]
    fields = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.split()
    state = dict(zip(fields[::2], fields[1::2], strict=False))
    return state.get("num-slaves") == "1" and state.get("num-other-sentinels") == str(count - 1)


def replica_offset_caught_up(port: int, host: str = "127.0.0.1") -> bool:
    """Every write the primary at ``host:port`` acknowledged has reached its replica."""
    argv = ["redis-cli", "-h", host, "-p", str(port), "wait", "1", "1000"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    return done.stdout.strip() == "1"


async def put_until_served(client: blobsdk.Client, path: str, data: bytes) -> None:
    """``put`` until one is acknowledged: while the Sentinels promote the replica (a second to
    call the primary down, then an election), a put fails Unavailable; the bound is theirs."""
    deadline = time.monotonic() + FAILOVER_BOUND_S
    while True:
        try:
            await client.put(path, data)
            return
        except blobsdk.errors.Unavailable:
            if time.monotonic() > deadline:
                raise


def test_several_api_servers_need_redis():
    message = (
        "several API servers share their store only in Redis: give --metadata redis://HOST:PORT/DB, "
        "or --metadata redis (a Redis, its replica and the Sentinels that fail it over, started by the cluster)"
    )
    with pytest.raises(ValueError) as caught:
        ClusterOptions(api_servers=2)
    assert str(caught.value) == message
    with pytest.raises(ValueError) as zero:
        ClusterOptions(api_servers=0)
    assert str(zero.value) == "api_servers must be at least 1, got 0"
    assert ClusterOptions(api_servers=2, metadata="redis", hosts=True).hosts  # its own Redis runs on hosts
    result = subprocess.run(
        [sys.executable, "-m", "servers.cluster", "--dir", "d", "--api-servers", "2"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.strip().endswith(f"error: {message}")


def test_the_command_takes_api_servers_and_own_redis():
    _, options = parse_args(["--dir", "d", "--api-servers", "2", "--metadata", "redis"])
    assert (options.api_servers, options.metadata) == (2, "redis")
    _, hosted = parse_args(["--dir", "d", "--hosts", "--api-servers", "2", "--metadata", "redis", "--link", "redis=100:100"])
    assert (hosted.hosts, hosted.links["redis"].up) == (True, 100)
    _, default = parse_args(["--dir", "d"])
    assert (default.api_servers, default.metadata) == (1, None)
