"""The client over a real local cluster: API server + 3 block server processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import blobsdk
from blobsdk.config import HedgeConfig, WriteConfig
from servers.cluster import start_cluster
from tests.helpers import ROOT, gc_ahead, stored_files

SMALL = {"chunk_size": 64 << 10, "block_size": 256 << 10}


def _kill(cluster, name: str) -> None:
    proc = next(p for p in cluster.processes if p.name == name)
    proc.popen.kill()
    proc.popen.wait()


def _block_files(dir: Path) -> list[Path]:
    return [f for f in stored_files(dir) if not f.name.endswith(".tmp")]


def _config(cluster, **write):
    return msgspec.structs.replace(cluster.config, write=WriteConfig(**{**SMALL, **write}))


async def test_cluster_round_trip_put_many_list_delete_gc(tmp_path):
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=0, trackers=0) as cluster:
        cfg = _config(cluster)
        async with blobsdk.Client(cfg) as c:
            items = [(f"/ds/{i:03d}", os.urandom(5000 + i)) for i in range(50)]
            await c.put_many(items)
            assert [i.path async for i in c.list("/ds/")] == [p for p, _ in items]
            for path, data in items[::7]:
                assert await c.get(path) == data
                assert await c.get(path, offset=100, length=50) == data[100:150]
            await c.put("/b/gone", os.urandom(300_000))
            await c.delete("/b/gone")
            report = await gc_ahead(c)
            assert report.blocks_deleted >= 2  # the deleted blob's blocks
            for path, data in items:
                assert await c.get(path) == data


async def test_write_without_quorum_fails_cleanly_and_keeps_the_old_version(tmp_path):
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=0, trackers=0) as cluster:
        async with blobsdk.Client(_config(cluster)) as c:
            await c.put("/b/x", b"old" * 50_000)
        _kill(cluster, "block-2")
        async with blobsdk.Client(_config(cluster, write_quorum="all")) as c:
            needs_all = r"^a write needs 3 of the 3 block servers and 1 failed: connection refused at "
            with pytest.raises(blobsdk.Unavailable, match=needs_all):
                await c.put("/b/x", b"new" * 50_000)
            assert await c.get("/b/x") == b"old" * 50_000
            assert (await c.stat("/b/x")).version == 1
        async with blobsdk.Client(_config(cluster)) as c:  # the default quorum: a majority, 2 of 3
            await c.put("/b/x", b"new" * 50_000)
            assert await c.get("/b/x") == b"new" * 50_000


async def test_a_flipped_byte_on_one_block_server_is_never_returned(tmp_path):
    async with start_cluster(tmp_path, block_servers=3, l3_nodes=0, trackers=0) as cluster:
        data = os.urandom(200_000)
        cfg = msgspec.structs.replace(_config(cluster), hedge=HedgeConfig(enabled=False))  # exact counts
        async with blobsdk.Client(cfg) as c:
            await c.put("/b/c", data)
            l4 = next(t for t in c._open.readpath.tiers if t.name == "l4")
            plan = await c._open.plans.get_plan("/b/c")
            # Keep good copies only on the replica ranked last for chunk 0, so that chunk
            # is sure to meet both bad copies before the good one.
            good = l4.candidates(plan.chunks[0].key)[-1].name
        for i, url in enumerate(cluster.config.block_urls):
            if url == good:
                continue
            blocks = _block_files(tmp_path / f"blocks-{i}")
            assert blocks
            for f in blocks:
                raw = bytearray(f.read_bytes())
                for j in range(0, len(raw), 4096):  # a flip in every chunk
                    raw[j] ^= 0x01
                f.write_bytes(raw)
        async with blobsdk.Client(cfg) as c:
            l4 = next(t for t in c._open.readpath.tiers if t.name == "l4")
            bad_reads = sum([r.name for r in l4.candidates(ch.key)].index(good) for ch in plan.chunks)
            got = bytearray()
            for chunk in plan.chunks:  # one at a time: each ranked as at rest (no replica busier)
                got += await c.get("/b/c", len(got), chunk.raw_length)
            assert got == data
            # at most the bad copies ranked first: a replica that served one is then tried last
            assert bad_reads >= 2 and 0 < c.stats()["l4"]["corrupt"] <= bad_reads


async def test_an_l3_node_killed_mid_epoch(tmp_path):
    async with start_cluster(tmp_path, block_servers=2, l3_nodes=2, trackers=0) as cluster:
        cfg = msgspec.structs.replace(_config(cluster), l1=blobsdk.L1Config(capacity_bytes=0))
        blobs = {f"/ds/{i:03d}": os.urandom(150_000 + i) for i in range(40)}
        async with blobsdk.Client(cfg) as c:
            await c.put_many(blobs.items())
            paths = list(blobs)
            for i in range(0, len(paths), 8):
                if i == 16:
                    _kill(cluster, "l3-0")
                batch = paths[i : i + 8]
                results = await asyncio.gather(*(c.get(p) for p in batch))
                assert all(r == blobs[p] for p, r in zip(batch, results, strict=True))
            stats = c.stats()
            assert stats["l3"]["hits"] > 0 and stats["l3"]["errors"] >= 1
            assert stats["l3"]["nodes_down"] == 1
            # a warm second epoch: the surviving node serves from its flash
            for path, data in blobs.items():
                assert await c.get(path) == data
            assert c.stats()["l3"]["node_hits"] > 0


async def test_cli_stats_reports_the_l3_nodes(tmp_path):
    async with start_cluster(tmp_path, block_servers=1, l3_nodes=2, trackers=0) as cluster:
        async with blobsdk.Client(_config(cluster)) as c:
            await c.put("/b/x", os.urandom(100_000))
            await c.get("/b/x")
            nodes = (await c.node_stats())["l3"]
            assert sorted(nodes) == sorted(cluster.config.l3_urls)
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "blobsdk", "--config", str(cluster.config_path), "stats"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        report = json.loads(result.stdout)
        assert report["client"]["l3"]["enabled"] is True
        assert sorted(report["nodes"]["l3"]) == sorted(cluster.config.l3_urls)
