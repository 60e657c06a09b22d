"""servers/clusterhosts.py: the one-command cluster with each server in a testbed host of its
own, links by kind and by server, a client in the root namespace and one in a client host
reading and writing through it, a restart on the same host, and a partitioned server."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

import blobsdk
from blobsdk.config import ClientConfig
from servers._common import netns
from servers.cluster import start_cluster
from servers.testbed import Link
from tests.servers.test_cluster import _alive, _wait_for
from tests.servers.test_testbed import CONNECT_TIMEOUT_S, HEALED_TIMEOUT_S, connects, leftovers

LINKS = {"block": Link(up=1000, down=1000), "block-2": Link(up=50, down=50)}


@pytest.fixture
async def cluster(testbed_unavailable, tmp_path):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    async with start_cluster(tmp_path / "cluster", hosts=True, links=LINKS, l3_nodes=1) as running:
        yield running
    assert running.placement is None


def _address(url: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(urlsplit(url).hostname)


async def test_each_server_runs_in_a_host_of_its_own_with_its_kinds_or_its_own_link(cluster):
    bed = cluster.placement.testbed
    assert sorted(bed.hosts) == ["api", "block-0", "block-1", "block-2", "l3", "tracker"]
    for proc in cluster.processes:
        assert proc.url == f"http://{bed.host(proc.name).address}:{urlsplit(proc.url).port}"
        assert proc.pid in netns.namespace_pids(bed.host(proc.name).namespace)
    config = cluster.config
    assert {_address(u) in bed.network for u in [config.api_url, *config.block_urls, *config.l3_urls, *config.tracker_urls]} == {
        True
    }
    assert "rate 1Gbit" in bed.qdiscs("block-0")[0] and "rate 50Mbit" in bed.qdiscs("block-2")[1]
    assert "qdisc noqueue" in bed.qdiscs("api")[0]
    assert config.peer.host == bed.driver_address and str(bed.network) in config.peer.allowed_networks
    assert ClientConfig.from_toml(cluster.config_path) == config


async def test_clients_in_the_root_and_in_a_client_host_write_and_read_through_it(cluster):
    data = os.urandom(300_000)
    async with blobsdk.Client(cluster.config) as c:
        await c.put("/b/x", data)
        assert await c.get("/b/x") == data
    client = cluster.add_client_host("client-0", Link(up=100, down=100))
    assert client.config.peer.host == client.address
    assert client.config.l2 is not None and client.config.l2.dir == str(client.dir / "l2")
    assert ClientConfig.from_toml(client.config_path) == client.config
    cat = [sys.executable, "-m", "blobsdk", "--config", str(client.config_path), "cat", "/b/x"]
    with client.popen(cat, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err, out == data) == (0, b"", True)
    assert "rate 100Mbit" in cluster.placement.testbed.qdiscs("client-0")[0]


async def test_a_dead_server_restarts_in_its_host_and_a_partitioned_one_is_unreachable(cluster):
    bed = cluster.placement.testbed
    block = next(p for p in cluster.processes if p.name == "block-1")
    address, port = urlsplit(block.url).hostname, urlsplit(block.url).port
    block.popen.kill()
    block.popen.wait()
    cluster.restart(block)
    assert block.host == bed.host("block-1").address
    _wait_for(lambda: connects(address, port, HEALED_TIMEOUT_S), 60, "the restarted server listens")
    bed.partition("block-1")
    assert not connects(address, port, CONNECT_TIMEOUT_S)
    bed.heal("block-1")
    assert connects(address, port, HEALED_TIMEOUT_S)


async def test_stopping_the_cluster_removes_its_testbed(testbed_unavailable, tmp_path):
    if testbed_unavailable is not None:
        pytest.skip(testbed_unavailable)
    async with start_cluster(tmp_path, hosts=True, block_servers=1, l3_nodes=0, trackers=0) as running:
        subnet = running.placement.testbed.subnet
        pids = [p.pid for p in running.processes]
    assert leftovers(subnet) == []
    assert not any(_alive(pid) for pid in pids)
