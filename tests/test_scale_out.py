"""Past one machine (issue 13): a client whose metadata is in Redis (``metadata_url``) and whose
L4 is an S3 bucket (``source_url``: moto's S3 API, and SeaweedFS), through the tiers, from client.toml."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import blobsdk
from blobsdk._redisurl import FORM
from blobsdk.assembly import _block_store
from blobsdk.config import ClientConfig, S3Config
from blobsdk.metadata import RedisMetadataStore
from blobsdk.net.limiter import LimiterRegistry
from blobsdk.sources import S3BlockStore
from servers.cluster import start_cluster
from servers.redisd import start_redis
from tests.helpers import ROOT, S3_STORES, redis_s3_toml, s3_server

MiB = 1 << 20


@pytest.fixture(scope="module", params=S3_STORES)
def services(request, tmp_path_factory):
    with start_redis(tmp_path_factory.mktemp("redis")) as redis, s3_server(request) as s3:
        s3.make_bucket("lake")
        yield redis, s3


def config_of(services, tmp_path: Path, **tables) -> ClientConfig:
    redis, s3 = services
    (tmp_path / "client.toml").write_text(redis_s3_toml(redis.url, "s3://lake/blobsdk", s3.endpoint, **tables))
    return ClientConfig.from_toml(tmp_path / "client.toml")


async def test_an_epoch_over_redis_and_s3_verifies_every_byte(services, tmp_path):
    config = config_of(services, tmp_path, write={"chunk_size": MiB, "block_size": 4 * MiB})
    blobs = {f"/data/train/{i:03d}": os.urandom((i % 5 + 1) * 300_000) for i in range(24)}
    async with blobsdk.Client(config) as c:
        await c.put_many(blobs.items())
        await c.put("/data/big", big := os.urandom(9 * MiB))  # chunks over several blocks
    # A reader whose gc may take a grace of 0.3 s (it writes nothing: moto is too slow for a
    # write window of 0.2 s on a loaded machine).
    reader = config_of(services, tmp_path, write={"chunk_size": MiB, "block_size": 4 * MiB, "max_write_seconds": 0.2})
    async with blobsdk.Client(reader) as c:  # a fresh client: L1 empty, every chunk from S3
        for path, data in blobs.items():
            assert await c.get(path) == data
        assert await c.get("/data/big", offset=5 * MiB - 7, length=2 * MiB) == big[5 * MiB - 7 : 7 * MiB - 7]
        assert sorted([i.path async for i in c.list("/data/train/")]) == sorted(blobs)
        stats = c.stats()
        assert stats["l4"]["hits"] >= len(blobs) and stats["l4"]["corrupt"] == 0
        await c.delete("/data/train/000")
        report = await c.gc(grace=0.3)
        assert report.blocks_scanned >= 1 and report.blocks_referenced >= 1
        assert await c.get("/data/train/001") == blobs["/data/train/001"]


async def test_a_checkpoint_round_trips_through_redis_and_s3(services, tmp_path):
    import numpy as np

    async with blobsdk.Client(config_of(services, tmp_path)) as c:
        ck = c.checkpoints("/ckpt/run", keep=2)
        state = {"w": np.arange(3 * MiB, dtype=np.float32)}
        await (await ck.save(1, state)).wait()
        state["w"][:10] = -1
        manifest = await (await ck.save(2, state)).wait()
        assert manifest.new_bytes <= 4 * MiB  # one chunk of the three
        assert np.array_equal((await ck.load())["w"], state["w"])


def test_the_config_names_one_metadata_and_one_l4():
    with pytest.raises(ValueError, match=r"^api_url and metadata_url both name the metadata: set one$"):
        ClientConfig(api_url="http://a", metadata_url="redis://r:6379/0", block_urls=("http://b",))
    with pytest.raises(ValueError, match=r"^block_urls and source_url both name L4: set one$"):
        ClientConfig(api_url="http://a", block_urls=("http://b",), source_url="s3://xyz")
    with pytest.raises(ValueError) as caught:
        ClientConfig(metadata_url="sqlite:///x", source_url="s3://xyz")
    assert str(caught.value) == f"metadata_url must be {FORM}, got 'sqlite:///x'"
    with pytest.raises(ValueError, match=r"^an S3 location is s3://BUCKET\[/PREFIX\], got 's3:///x'$"):
        ClientConfig(metadata_url="redis://r:6379/0", source_url="s3:///x")
    with pytest.raises(ValueError, match=r"^L4 needs its metadata: an api_url \(the metadata API server\) or a metadata_url"):
        ClientConfig(source_url="s3://xyz")
    config = ClientConfig(metadata_url="redis://r:6379/0", source_url="s3://xyz/p", s3=S3Config(region="eu-west-1"))
    text = config.to_toml()
    assert 'metadata_url = "redis://r:6379/0"\n' in text and 'source_url = "s3://xyz/p"\n' in text
    assert '\n[s3]\nregion = "eu-west-1"\nallow_http = false\n' in text
    assert ClientConfig.from_dict(tomllib.loads(text)) == config


def test_an_s3_l4_s_limiter_is_cut_by_drops_not_by_latency():
    """An object store's latency is no load signal (blobsdk/net/limiter.py): the S3 L4's
    limiter, the client's and a bare store's, only drops cut."""
    config = ClientConfig(metadata_url="redis://r:6379/0", source_url="s3://xyz/p", s3=S3Config(region="eu-west-1"))
    registry = LimiterRegistry(config.limiter)
    store = _block_store(config, None, registry)  # type: ignore[arg-type]  # an S3 L4 needs no session
    assert store.limiter is registry.get("s3://xyz/p", by_latency=False)
    assert not S3BlockStore("xyz", config={"region": "eu-west-1"}).limiter.by_latency


async def test_a_local_cluster_over_redis_and_s3_reads_through_its_l3_node(services, tmp_path):
    """``servers.cluster --metadata redis://... --source s3://...``: the API server keeps the
    metadata in Redis, the L3 node reads through from S3, and there are no block servers."""
    redis, s3 = services
    s3_config = S3Config(allow_http=True, **s3.config)
    options = {"metadata": redis.url, "source": "s3://lake/cluster", "s3": s3_config, "l3_nodes": 1, "trackers": 0}
    async with start_cluster(tmp_path, **options) as cluster:
        assert cluster.config is not None and cluster.config.block_urls == () and cluster.config.source_url == "s3://lake/cluster"
        assert [p.kind for p in cluster.processes] == ["api", "l3"]
        data = os.urandom(3 * MiB)
        async with blobsdk.Client(cluster.config) as c:
            await c.put("/c/x", data)
        async with blobsdk.Client(cluster.config) as c:
            assert await c.get("/c/x") == data
            assert await c.get("/c/x") == data
            assert c.stats()["l3"]["hits"] >= 1  # the node read it through from S3
    async with RedisMetadataStore(redis.url) as store:  # the API server wrote to Redis
        assert (await store.get_plan("/c/x")).size == 3 * MiB


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("servers.api", ["--db", "x.sqlite", "--metadata", "redis://r/0"], "argument --metadata: not allowed with argument --db"),
        (
            "servers.api",
            ["--metadata", "sqlite:///x"],
            f"--metadata: a Redis metadata URL must be {FORM}, got 'sqlite:///x'",
        ),
        ("servers.flash", ["--dir", "d", "--source", "http://x"], "source_url must be s3://BUCKET[/PREFIX]"),
        (
            "servers.flash",
            ["--dir", "d", "--block-url", "http://127.0.0.1:9", "--source", "s3://bkt"],
            "block_urls and source_url both name L4: set one",
        ),
        (
            "servers.cluster",
            ["--dir", "d", "--metadata", "sqlite:///x"],
            f"--metadata must be {FORM}, got 'sqlite:///x'; or redis: a Redis the cluster starts",
        ),
        (
            "servers.cluster",
            ["--dir", "d", "--source", "gs://b"],
            "--source: an S3 location is s3://BUCKET[/PREFIX], got 'gs://b'",
        ),
    ],
)
def test_the_servers_refuse_bad_store_flags(tmp_path, module, args, message):
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(message), done.stderr


async def test_a_block_changed_in_the_bucket_is_never_served(services, tmp_path):
    """Someone overwrites a block object in S3 with other bytes of the same size: the read
    is CorruptData (verified at the L4 boundary), never the wrong bytes."""
    import obstore
    from obstore.store import S3Store

    config = config_of(services, tmp_path, write={"compression": '"none"'})
    data = os.urandom(300_000)
    async with blobsdk.Client(config) as c:
        await c.put("/tamper/x", data)
        (chunk,) = (await c.plan("/tamper/x")).chunks
    _, s3 = services
    bucket = S3Store("lake", prefix="blobsdk", config=s3.config, client_options={"allow_http": True})
    [key] = [m["path"] async for batch in obstore.list(bucket) for m in batch if m["path"].endswith(chunk.block_id)]
    await obstore.put_async(bucket, key, os.urandom(300_000))
    async with blobsdk.Client(config) as c:
        with pytest.raises(blobsdk.CorruptData, match=rf"^chunk {chunk.key}: no replica returned bytes matching its checksum"):
            await c.get("/tamper/x")
