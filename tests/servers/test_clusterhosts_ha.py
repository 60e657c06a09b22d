"""servers/cluster.py on hosts with every server in a host of its own: two API servers over the
cluster's Redis primary and replica (each in its host), L4 on SeaweedFS (in its host); a
client fails over when one API server's host is partitioned, and that server serves again
once it heals; and the Sentinels (one on each Redis host and one on a third) promote the
replica when the primary's host is partitioned."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

import msgspec
import pytest

import blobsdk
from blobsdk.config import Timeouts
from servers._common import netns
from servers.cluster import start_cluster

from ..helpers import until
from .test_cluster_api_ha import knows_replica_and_peers, put_until_served, replica_offset_caught_up, replication
from .test_testbed import HEALED_TIMEOUT_S, connects

HA = {"api_servers": 2, "metadata": "redis", "l3_nodes": 0, "trackers": 0, "startup_timeout": 120.0}
# The partitioned server's connects time out (dropped SYNs): 1 s each, then the client fails over.
TIMEOUTS = Timeouts(connect=1.0, sock_read=10.0, total=30.0, api_failover=2.0)


def _in(url: str, network: ipaddress.IPv4Network) -> bool:
    return ipaddress.IPv4Address(urlsplit(url).hostname) in network


async def test_api_servers_fail_over_across_a_partition_over_redis_and_seaweedfs_on_hosts(testbed_unavailable, tmp_path):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    async with start_cluster(tmp_path / "c", hosts=True, seaweedfs=True, **HA) as cluster:
        bed = cluster.placement.testbed
        assert sorted(bed.hosts) == ["api-0", "api-1", "redis", "redis-replica", "redis-sentinel", "seaweedfs"]
        primary, replica = cluster.redis
        for name, service in (("redis", primary), ("redis-replica", replica), ("seaweedfs", cluster.seaweed)):
            assert service.address == bed.host(name).address
            assert service.process.pid in netns.namespace_pids(bed.host(name).namespace)
        assert _in(primary.url, bed.network) and _in(cluster.config.s3.endpoint, bed.network)
        until(lambda: "master_link_status:up" in replication(replica.port, replica.address), timeout=30)
        config = msgspec.structs.replace(cluster.config, timeouts=TIMEOUTS)
        acked: dict[str, bytes] = {}
        async with blobsdk.Client(config) as client:
            for i in range(3):
                acked[f"/b/before-{i}"] = os.urandom(50_000 + i)
                await client.put(f"/b/before-{i}", acked[f"/b/before-{i}"])
            bed.partition("api-0")
            for i in range(3):
                acked[f"/b/during-{i}"] = os.urandom(70_000 + i)
                await client.put(f"/b/during-{i}", acked[f"/b/during-{i}"])  # api-1 takes it
                assert await client.get(f"/b/before-{i}") == acked[f"/b/before-{i}"]
            bed.heal("api-0")
        api0 = next(p for p in cluster.processes if p.name == "api-0")
        assert connects(bed.host("api-0").address, urlsplit(api0.url).port, HEALED_TIMEOUT_S)
        only_api0 = msgspec.structs.replace(config, api_urls=(), api_url=api0.url)
        async with blobsdk.Client(only_api0) as client:
            acked["/b/after"] = os.urandom(30_000)
            await client.put("/b/after", acked["/b/after"])
            for path, data in acked.items():
                assert await client.get(path) == data, path


async def test_a_partitioned_redis_primary_is_failed_over_by_the_sentinels_on_the_other_hosts(testbed_unavailable, tmp_path):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    async with start_cluster(tmp_path / "c", hosts=True, **HA) as cluster:
        bed = cluster.placement.testbed
        names = ("redis", "redis-replica", "redis-sentinel")
        assert [s.address for s in cluster.sentinels] == [bed.host(name).address for name in names]
        primary, replica = cluster.redis
        until(lambda: all(knows_replica_and_peers(s, 3) for s in cluster.sentinels), timeout=60)
        config = msgspec.structs.replace(cluster.config, timeouts=TIMEOUTS)
        acked: dict[str, bytes] = {}
        async with blobsdk.Client(config) as client:
            for i in range(3):
                acked[f"/b/before-{i}"] = os.urandom(40_000 + i)
                await client.put(f"/b/before-{i}", acked[f"/b/before-{i}"])
            until(lambda: replica_offset_caught_up(primary.port, primary.address), timeout=30)
            bed.partition("redis")  # the primary and one Sentinel: the other two are a majority
            acked["/b/during"] = os.urandom(60_000)
            await put_until_served(client, "/b/during", acked["/b/during"])
            assert "role:master" in replication(replica.port, replica.address)
            bed.heal("redis")
            for path, data in acked.items():
                assert await client.get(path) == data, path
