"""L3 nodes added to and removed from a running job: ``Client.set_l3_urls`` over a local
cluster that starts and stops one node at run time (``Cluster.add_server``/``remove_server``)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import msgspec
import pytest

import blobsdk
from blobsdk.config import L1Config, WriteConfig
from blobsdk.errors import BadRequest, ClientClosed
from servers.cluster import Cluster, ClusterError, start_cluster

CHUNK = 64 << 10


def _no_l1(config: blobsdk.ClientConfig) -> blobsdk.ClientConfig:
    """Every read goes to L3 (no L1 to hide it), in small chunks (many keys to place)."""
    return msgspec.structs.replace(
        config, l1=L1Config(capacity_bytes=0), write=WriteConfig(chunk_size=CHUNK, block_size=4 * CHUNK)
    )


async def test_nodes_added_and_removed_mid_job_serve_right_bytes_and_stats_show_it(tmp_path: Path) -> None:
    data = {f"/b/d/{i}": os.urandom(3 * CHUNK + i) for i in range(8)}
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=2, trackers=0) as cluster:
        assert cluster.config is not None
        async with blobsdk.Client(_no_l1(cluster.config)) as c:
            for path, blob in data.items():
                await c.put(path, blob)

            async def epoch() -> None:
                assert [await c.get(path) for path in data] == list(data.values())

            await epoch()
            added = await asyncio.to_thread(cluster.add_server, "l3")
            assert added.url in cluster.config.l3_urls and len(cluster.config.l3_urls) == 3
            reads = asyncio.gather(*(c.get(path) for path in data))  # in flight across the change
            await c.set_l3_urls(cluster.config.l3_urls)
            assert await reads == list(data.values())
            await epoch()
            assert c.config.l3_urls == cluster.config.l3_urls
            assert (c.stats()["l3"]["nodes"], c.stats()["l3"]["nodes_added"]) == (3, 1)
            assert sorted((await c.node_stats())["l3"]) == sorted(cluster.config.l3_urls)

            gone = next(p for p in cluster.processes if p.kind == "l3" and p is not added)
            reads = asyncio.gather(*(c.get(path) for path in data))
            await c.set_l3_urls([url for url in cluster.config.l3_urls if url != gone.url])  # told first: a drain
            await asyncio.to_thread(cluster.remove_server, gone)
            assert await reads == list(data.values())
            await epoch()
            l3 = c.stats()["l3"]
            assert (l3["nodes"], l3["nodes_added"], l3["nodes_removed"], l3["corrupt"]) == (2, 1, 1, 0)
            assert gone.url not in cluster.config.l3_urls and gone.url not in c.stats()["limits"]
            assert cluster.config_path.read_text().count(gone.url) == 0


async def test_bad_node_lists_are_refused_with_exact_errors(tmp_path: Path) -> None:
    async with blobsdk.Client.local(tmp_path) as c:
        cases: list[tuple[object, type[Exception], str]] = [
            ("http://10.0.0.1:7201", TypeError, "set_l3_urls: l3_urls must be a list of str, got 'http://10.0.0.1:7201'"),
            ([7201], TypeError, "set_l3_urls: l3_urls must be a list of str, got [7201]"),
            (["10.0.0.1:7201"], BadRequest, "set_l3_urls: l3_urls must be http:// or https:// URLs, got '10.0.0.1:7201'"),
            (
                [],
                BadRequest,
                "set_l3_urls: l3_urls must name at least one node (a client without L3 is opened without them)",
            ),
            (["http://10.0.0.1:7201"], BadRequest, "set_l3_urls: this client has no L3 tier (it was opened without l3_urls)"),
        ]
        for urls, error, message in cases:
            with pytest.raises(error, match=f"^{re.escape(message)}$"):
                await c.set_l3_urls(urls)  # type: ignore[arg-type]
        assert c.config.l3_urls == ()
    with pytest.raises(ClientClosed, match=r"^client is not open: use `async with client:`$"):
        await c.set_l3_urls(["http://10.0.0.1:7201"])


def test_the_blocking_twin_refuses_the_same(tmp_path: Path) -> None:
    no_l3 = r"^set_l3_urls: this client has no L3 tier \(it was opened without l3_urls\)$"
    with blobsdk.SyncClient.local(tmp_path) as c, pytest.raises(BadRequest, match=no_l3):
        c.set_l3_urls(["http://10.0.0.1:7201"])


def test_a_cluster_adds_only_a_kind_of_server_it_has(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"^no server kind 'flash': one of api, block, l3, tracker$"):
        Cluster(tmp_path).add_server("flash")
