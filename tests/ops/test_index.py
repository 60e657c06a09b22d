"""Indexing S3 objects in place (blobsdk/ops/index.py; issue 13): blobs whose chunks are byte
ranges of existing objects in a data bucket, read through the tiers of a client whose
metadata is in Redis and whose L4 is S3 (moto's S3 API, and SeaweedFS; redis-server)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import msgspec
import obstore
import pytest
from obstore.store import S3Store

import blobsdk
from blobsdk.config import ClientConfig
from blobsdk.ops.index import IndexProgress
from blobsdk.sources import S3BlockStore, S3Object
from blobsdk.sources.base import block_time, is_link, links_to
from servers.redisd import start_redis
from tests.cli.test_cli import run as run_cli
from tests.helpers import S3_STORES, gc_ahead, redis_s3_toml, s3_server

KiB = 1 << 10
CHUNK = 64 * KiB


@pytest.fixture(scope="module", params=S3_STORES)
def services(request, tmp_path_factory):
    with start_redis(tmp_path_factory.mktemp("redis")) as redis, s3_server(request) as s3:
        s3.make_bucket("lake")  # the data, where it already is
        s3.make_bucket("blobs")  # the client's own L4: link blocks only
        yield redis, s3


@pytest.fixture
def run_id() -> str:
    return secrets.token_hex(4)


def config_of(services, tmp_path: Path, run_id: str, max_write_seconds: float = 60.0) -> ClientConfig:
    """A client of the services (gc in these tests runs on a clock ahead, tests.helpers.gc_ahead,
    so no client needs a short ``max_write_seconds``: a write over it fails on a loaded machine)."""
    redis, s3 = services
    write = {"chunk_size": CHUNK, "max_write_seconds": max_write_seconds}
    tables = {"write": write, "read": {"plan_cache_ttl_seconds": 0}}
    (tmp_path / "client.toml").write_text(redis_s3_toml(redis.url, f"s3://blobs/sdk-{run_id}", s3.endpoint, **tables))
    return ClientConfig.from_toml(tmp_path / "client.toml")


def lake(services) -> S3Store:
    return S3Store("lake", config=services[1].config, client_options={"allow_http": True})


async def put_objects(bucket: S3Store, objects: dict[str, bytes]) -> None:
    await asyncio.gather(*(obstore.put_async(bucket, key, data) for key, data in objects.items()))


async def keys_under(bucket: S3Store, prefix: str) -> list[str]:
    return sorted([str(m["path"]) async for batch in obstore.list(bucket, prefix=prefix) for m in batch])


def dataset(prefix: str, n: int = 100) -> dict[str, bytes]:
    """``n`` objects of 0 bytes up to ~5 chunks, some exactly a chunk or two."""
    sizes = [0, 1, CHUNK, 2 * CHUNK, CHUNK + 1] + [(i * 7919) % (5 * CHUNK) + 1 for i in range(n - 5)]
    return {f"{prefix}/{i:03d}.bin": os.urandom(size) for i, size in enumerate(sizes)}


async def test_objects_indexed_in_place_read_back_and_a_change_is_detected_until_indexed_again(services, tmp_path, run_id):
    import redis

    with redis.Redis.from_url(services[0].url) as r:
        r.flushdb()  # scrub and gc below walk every plan: let them be this test's only
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"ds-{run_id}/train"
    objects = dataset(prefix)
    await put_objects(bucket, objects)
    path_of = {key: f"/data/{run_id}/{key.rsplit('/', 1)[1]}" for key in objects}
    seen: list[IndexProgress] = []

    async with blobsdk.Client(config) as c:
        report = await c.index_s3(f"s3://lake/{prefix}", f"/data/{run_id}", progress=lambda p: seen.append(p))
    assert (report.objects, report.indexed, report.unchanged, report.removed) == (100, 100, 0, 0), report.failed
    assert report.failed == [] and report.skipped == [] and report.bytes_indexed == sum(map(len, objects.values()))
    assert seen[-1].objects_done == seen[-1].objects_total == 100 and seen[-1].bytes_done == report.bytes_indexed

    # Nothing was copied: the client's bucket holds one small link block per non-empty object.
    blocks = S3BlockStore("blobs", f"sdk-{run_id}", config=services[1].config, allow_http=True)
    listed = [info async for info in blocks.list_blocks()]
    assert len(listed) == 99 and all(is_link(b.block_id) and b.size < 300 for b in listed)

    async with blobsdk.Client(config) as c:  # a fresh client: every chunk from the objects themselves
        for key, data in objects.items():
            assert await c.get(path_of[key]) == data
        plan = await c.plan(path_of[f"{prefix}/003.bin"])
        assert [(ch.offset, ch.length, ch.codec) for ch in plan.chunks] == [(0, CHUNK, "none"), (CHUNK, CHUNK, "none")]
        assert c.stats()["l4"]["corrupt"] == 0

    changed, deleted = f"{prefix}/007.bin", f"{prefix}/008.bin"
    etag = (await obstore.head_async(bucket, changed))["e_tag"]
    await obstore.put_async(bucket, changed, new := os.urandom(3 * CHUNK + 5))
    await obstore.delete_async(bucket, deleted)
    async with blobsdk.Client(config) as c:
        with pytest.raises(
            blobsdk.SourceChanged,
            match=rf"^s3://lake/{re.escape(changed)} changed since it was indexed \(its ETag then: {re.escape(etag)}\); "
            r"index it again \(client\.index_s3, or blobsdk import --in-place\) to read its new bytes$",
        ):
            await c.get(path_of[changed])
        with pytest.raises(blobsdk.SourceChanged, match=rf"^s3://lake/{re.escape(deleted)} is gone: it was deleted since"):
            await c.get(path_of[deleted])
        assert await c.get(path_of[f"{prefix}/009.bin"]) == objects[f"{prefix}/009.bin"]  # the others read fine
        scrub = await c.scrub(dry_run=True)  # verifies every object against its indexed checksums
        assert (scrub.blocks_checked, scrub.copies_missing, scrub.blocks_unrepaired) == (99, 2, 2)

        report = await c.index_s3(f"s3://lake/{prefix}", f"/data/{run_id}/")
        assert (report.objects, report.indexed, report.unchanged, report.removed) == (99, 1, 98, 1)
        assert report.bytes_indexed == len(new)  # only the changed object was read again
        assert await c.get(path_of[changed]) == new
        with pytest.raises(blobsdk.BlobNotFound):
            await c.stat(path_of[deleted])

    async with blobsdk.Client(config_of(services, tmp_path, run_id)) as c:
        gc = await gc_ahead(c)
        assert gc.blocks_deleted == 2  # the links of 007's old version and of 008: never an object
    assert await keys_under(bucket, prefix) == sorted(set(objects) - {deleted})


async def test_an_unchanged_index_reads_nothing_and_keeps_the_chunk_keys(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"same-{run_id}"
    await put_objects(bucket, {f"{prefix}/a": (data := os.urandom(2 * CHUNK)), f"{prefix}/b": b""})
    async with blobsdk.Client(config) as c:
        await c.index_s3(f"s3://lake/{prefix}", f"/same/{run_id}")
        before = await c.plan(f"/same/{run_id}/a")
        report = await c.index_s3(f"s3://lake/{prefix}", f"/same/{run_id}")
        assert (report.indexed, report.unchanged, report.bytes_indexed) == (0, 2, 0)
        after = await c.plan(f"/same/{run_id}/a")
        assert after.version == before.version and [ch.key for ch in after.chunks] == [ch.key for ch in before.chunks]
        assert await c.get(f"/same/{run_id}/b") == b""
        (link,) = before.block_ids()
        await S3BlockStore("blobs", f"sdk-{run_id}", config=services[1].config, allow_http=True).delete_block(link)
        report = await c.index_s3(f"s3://lake/{prefix}", f"/same/{run_id}")  # a lost link is made again
        assert (report.indexed, report.unchanged) == (1, 1)
        async with blobsdk.Client(config) as fresh:
            assert await fresh.get(f"/same/{run_id}/a") == data


async def test_blobs_not_indexed_in_place_are_never_removed(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"mixed-{run_id}"
    await put_objects(bucket, {f"{prefix}/a": b"from the lake"})
    async with blobsdk.Client(config) as c:
        await c.put(f"/mixed/{run_id}/mine", b"written by a put")
        await c.index_s3(f"s3://lake/{prefix}", f"/mixed/{run_id}")
        await c.index_s3(f"s3://lake/other-{run_id}", f"/mixed/{run_id}")  # another prefix, empty: removes nothing of it
        assert [i.path async for i in c.list(f"/mixed/{run_id}/")] == [f"/mixed/{run_id}/a", f"/mixed/{run_id}/mine"]
        await obstore.delete_async(bucket, f"{prefix}/a")
        report = await c.index_s3(f"s3://lake/{prefix}", f"/mixed/{run_id}")
        assert report.removed == 1
        assert [i.path async for i in c.list(f"/mixed/{run_id}/")] == [f"/mixed/{run_id}/mine"]


async def test_keys_that_are_no_blob_paths_are_skipped_and_directory_markers_ignored(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"keys-{run_id}"
    long_name = "/".join(["x" * 180] * 5)  # SeaweedFS takes no key segment over 255 bytes
    await put_objects(bucket, {f"{prefix}/dir/": b"", f"{prefix}/dir/a": b"a", f"{prefix}/{long_name}": b"long"})
    dest = f"/keys/{run_id}/" + "d" * 200
    async with blobsdk.Client(config) as c:
        report = await c.index_s3(f"s3://lake/{prefix}", dest)
        assert (report.objects, report.indexed) == (2, 1)
        assert report.skipped == [
            f"s3://lake/{prefix}/{long_name}: path is {len(dest) + 1 + len(long_name)} bytes, over the limit of 1024"
        ]
        assert [i.path async for i in c.list(dest + "/")] == [f"{dest}/dir/a"]


async def test_a_key_in_the_reserved_namespace_is_skipped_and_the_others_indexed(services, tmp_path, run_id):
    """An object whose blob path would lie under /{bucket}/.blobsdk/ (what any writer of the
    S3 bucket can name) is skipped and reported, as a user's put there is refused; the pass goes on."""
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"rsv-{run_id}"
    entry = f".blobsdk/chunks/{'0' * 32}"
    await put_objects(bucket, {f"{prefix}/{entry}": b"\x66" * 100, f"{prefix}/a": b"a"})
    dest = f"/rsv{run_id}"
    async with blobsdk.Client(config) as c:
        report = await c.index_s3(f"s3://lake/{prefix}", dest)
        assert (report.objects, report.indexed, report.failed) == (2, 1, [])
        assert report.skipped == [
            f"s3://lake/{prefix}/{entry}: path '{dest}/{entry}': {dest}/.blobsdk/ is reserved for blobsdk's own records"
            " (it can be read and listed, not written or deleted)"
        ]
        assert [i.path async for i in c.list(dest + "/")] == [f"{dest}/a"]


async def test_an_object_that_changes_during_the_pass_fails_alone(services, tmp_path, run_id):
    """The listing saw one version, the read finds another: that object is reported failed
    (If-Match), the others are indexed."""
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"race-{run_id}"
    await put_objects(bucket, {f"{prefix}/a": b"a" * 10, f"{prefix}/b": b"b" * 10})
    async with blobsdk.Client(config) as c:
        store = c._open.blocks
        assert isinstance(store, S3BlockStore)
        listing = store.objects

        async def changing(bucket_name: str, key_prefix: str = ""):
            async for obj in listing(bucket_name, key_prefix):
                if obj.key.endswith("/a"):
                    await obstore.put_async(bucket, obj.key, b"changed!")
                yield obj

        store.objects = changing  # type: ignore[method-assign]
        report = await c.index_s3(f"s3://lake/{prefix}", f"/race/{run_id}")
        assert report.indexed == 1 and len(report.failed) == 1
        url, why = report.failed[0]
        assert (url, why) == (
            f"s3://lake/{prefix}/a",
            f"s3://lake/{prefix}/a changed or was deleted since it was listed: not indexed",
        )
        assert [i.path async for i in c.list(f"/race/{run_id}/")] == [f"/race/{run_id}/b"]


async def test_bad_calls_are_refused_with_their_reason(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    async with blobsdk.Client(config) as c:
        with pytest.raises(ValueError, match=r"^an S3 location is s3://BUCKET\[/PREFIX\], got 'lake/x'$"):
            await c.index_s3("lake/x", "/d")
        with pytest.raises(blobsdk.InvalidPath, match=r"^path must be absolute"):
            await c.index_s3("s3://lake/x", "d")
        with pytest.raises(ValueError, match=r"^index_s3: parallel must be an int >= 1, got 0$"):
            await c.index_s3("s3://lake/x", "/d", parallel=0)
        with pytest.raises(
            ValueError, match=r"^'s3://la ke/x': 'la ke' is no bucket name \(letters, digits, '\.', '_' and '-'\)$"
        ):
            await c.index_s3("s3://la ke/x", "/d")  # obstore panics on it
        with pytest.raises(ValueError, match=r"^'s3://lake/a//b': an S3 prefix has no empty, '\.' or '\.\.' segment$"):
            await c.index_s3("s3://lake/a//b", "/d")
        with pytest.raises(blobsdk.InvalidPath, match=r"^path is empty$"):
            await c.index_s3("s3://lake/x", "")
        with pytest.raises(blobsdk.InvalidPath, match=r"^path '/d/\.blobsdk/x': /d/\.blobsdk/ is reserved for blobsdk's own"):
            await c.index_s3("s3://lake/x", "/d/.blobsdk")
    async with blobsdk.Client.local(tmp_path / "embedded") as c:
        with pytest.raises(
            blobsdk.BadRequest, match=r'^indexing in place needs an S3 source \(source_url = "s3://\.\.\." in client\.toml\); '
        ):
            await c.index_s3("s3://lake/x", "/d")


async def test_a_key_obstore_cannot_list_is_a_clear_error(services, tmp_path, run_id):
    import boto3

    s3 = services[1]
    if s3.name == "SeaweedFS":
        pytest.skip("SeaweedFS refuses a key with a '..' segment (400 InvalidRequest): only moto can hold one")
    boto = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    boto.put_object(Bucket="lake", Key=f"dots-{run_id}/a/../b", Body=b"x")
    async with blobsdk.Client(config_of(services, tmp_path, run_id)) as c:
        with pytest.raises(
            blobsdk.BadRequest,
            match=rf"^s3://lake/dots-{run_id}: obstore cannot list a key in it \(.*\): list a prefix without it$",
        ):
            await c.index_s3(f"s3://lake/dots-{run_id}", "/dots")


async def test_a_link_block_is_checked_against_its_id(services, run_id):
    s3 = services[1]
    async with S3BlockStore("blobs", f"links-{run_id}", config=s3.config, allow_http=True) as store:
        obj = S3Object(bucket="lake", key="k", etag='"e"', size=3)
        block_id = await store.link(obj)
        assert is_link(block_id) and links_to(block_id, obj.identity) and abs(block_time(block_id) - time.time()) < 60
        with pytest.raises(
            blobsdk.BadRequest, match=rf"^block id {block_id} is a link block's: links are made by link\(\), not written$"
        ):
            await store.write_block(block_id, [b"xyz"])
        other = S3Object(bucket="lake", key="other", etag='"e"', size=3)
        async with S3BlockStore("blobs", f"links-{run_id}", config=s3.config, allow_http=True) as forged:  # nothing remembered
            await obstore.put_async(forged._store, forged._key(block_id), msgspec.json.encode(other))
            with pytest.raises(
                blobsdk.CorruptData, match=rf"^link block {block_id} in s3://blobs/links-{run_id} at .* points at s3://lake/other"
            ):
                await forged.read_range(block_id, 0, 1)


def test_the_cli_indexes_in_place_and_refuses_wrong_arguments(services, tmp_path, run_id):
    config_of(services, tmp_path, run_id)
    bucket = lake(services)
    objects = {f"cli-{run_id}/x/{i}": os.urandom(3000) for i in range(5)}
    asyncio.run(put_objects(bucket, objects))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args)
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())

    toml = str(tmp_path / "client.toml")
    done = cli("--config", toml, "import", f"s3://lake/cli-{run_id}", f"/cli/{run_id}", "--in-place")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["objects"], report["indexed"], report["failed"]) == (5, 5, [])
    assert "index in place" in done.stderr and "5/5 objects" in done.stderr
    done = cli("--config", toml, "get", f"/cli/{run_id}/x/3", str(tmp_path / "out"))
    assert done.returncode == 0 and (tmp_path / "out").read_bytes() == objects[f"cli-{run_id}/x/3"], done.stderr

    for args, message in [
        (("import", f"s3://lake/cli-{run_id}", "/cli/y"), "an s3:// source is indexed in place, not copied: add --in-place"),
        (
            ("import", str(tmp_path), "/cli/y", "--in-place"),
            f"--in-place indexes objects of an S3 bucket (s3://BUCKET/DIR), not {str(tmp_path)!r}",
        ),
        (("import", "s3://", "/cli/y", "--in-place"), "an S3 location is s3://BUCKET[/PREFIX], got 's3://'"),
    ]:
        done = cli("--config", toml, *args)
        assert done.returncode == 2 and done.stderr.strip().endswith(f"blobsdk: error: {message}"), done.stderr
    done = cli("--local", str(tmp_path / "embedded"), "import", "s3://lake/x", "/y", "--in-place")
    assert done.returncode == 2 and "blobsdk: error: indexing in place needs an S3 source" in done.stderr, done.stderr


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.timeout(600)
def test_a_dataloader_reads_a_lake_indexed_in_place_in_its_worker_processes(services, tmp_path, run_id):
    """The data-lake story end to end: index the objects where they are (SyncClient: obstore's
    runtime now runs in this process, which listed and linked), read one back here, then a
    DataLoader with two worker processes reads every sample of them, verified, from a
    client.toml naming only Redis and S3: forked workers too (their reads are signed GETs of
    the SDK's own, not obstore's), forkserver and spawn ones.  ``timeout`` is the hang
    guard: a worker that hangs fails the test."""
    from torch.utils.data import DataLoader

    from blobsdk.torch import BlobIterableDataset

    config = config_of(services, tmp_path, run_id, max_write_seconds=30)  # not the pass's ticks: no race with the machine
    objects = {f"dl-{run_id}/s/{i:03d}": os.urandom(1000 + 97 * i) for i in range(40)}
    asyncio.run(put_objects(lake(services), objects))
    with blobsdk.SyncClient(config) as c:
        assert c.index_s3(f"s3://lake/dl-{run_id}", f"/dl/{run_id}").indexed == 40
        assert c.get(f"/dl/{run_id}/s/000") == objects[f"dl-{run_id}/s/000"]
    dataset = BlobIterableDataset(tmp_path / "client.toml", f"/dl/{run_id}/")
    expected = {f"/dl/{run_id}/{key.split('/', 1)[1]}": data for key, data in objects.items()}

    def read(context: str) -> dict[str, bytes]:
        loader = DataLoader(dataset, num_workers=2, batch_size=8, collate_fn=list, multiprocessing_context=context, timeout=120)
        return {path: bytes(data) for batch in loader for path, data in batch}

    for context in ("fork", "forkserver", "spawn"):
        assert read(context) == expected, context


async def test_a_cluster_l3_node_reads_indexed_objects_through_and_passes_a_change_on(services, tmp_path, run_id):
    """``servers.cluster --source s3://...``: the L3 node reads link blocks through from the
    objects like any block, and a changed object reaches the client as SourceChanged."""
    from blobsdk.config import S3Config
    from servers.cluster import start_cluster

    redis, s3 = services
    s3_config = S3Config(allow_http=True, **s3.config)
    bucket, prefix = lake(services), f"cl-{run_id}"
    objects = {f"{prefix}/{name}": os.urandom(3 * CHUNK) for name in ("a", "b")}
    await put_objects(bucket, objects)
    options = {"metadata": redis.url, "source": f"s3://blobs/cl-{run_id}", "s3": s3_config, "l3_nodes": 1, "trackers": 0}
    async with start_cluster(tmp_path, **options) as cluster:
        assert cluster.config is not None
        async with blobsdk.Client(cluster.config) as c:
            assert (await c.index_s3(f"s3://lake/{prefix}", f"/cl/{run_id}")).indexed == 2
        async with blobsdk.Client(cluster.config) as c:
            assert await c.get(f"/cl/{run_id}/a") == objects[f"{prefix}/a"]
        async with blobsdk.Client(cluster.config) as c:  # L1 empty: from the L3 node
            assert await c.get(f"/cl/{run_id}/a") == objects[f"{prefix}/a"]
            assert c.stats()["l3"]["hits"] >= 1 and c.stats()["l4"]["hits"] == 0
            await obstore.put_async(bucket, f"{prefix}/b", os.urandom(10))
            with pytest.raises(blobsdk.SourceChanged, match=rf"^s3://lake/{prefix}/b changed since it was indexed"):
                await c.get(f"/cl/{run_id}/b")


# --- the pass's rules, each on its own ------------------------------------------------------


class CommitsSlowlyOrFails:
    """A metadata store (SQLite underneath) whose commit_many takes ``delay`` seconds, and
    whose ``fail_at``-th commit_many (counting from 1) fails once."""

    def __init__(self, inner, delay: float = 0.0, fail_at: int = 0, write_first: bool = False) -> None:
        self._inner, self._delay, self._fail_at, self.commits = inner, delay, fail_at, 0
        self._write_first = write_first  # another writer puts the first op's path just before the first commit
        self.batch_sizes: list[int] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def commit_many(self, ops):
        self.commits += 1
        self.batch_sizes.append(len(ops))
        await asyncio.sleep(self._delay)
        if self.commits == self._fail_at:
            raise blobsdk.Unavailable("metadata down for a moment")
        if self._write_first and self.commits == 1:
            path = ops[0].path
            await self._inner.commit(path, blobsdk.ReadPlan(path=path, version=0, etag="e", size=0, chunk_size=1))
        return await self._inner.commit_many(ops)


def store_client(services, tmp_path: Path, run_id: str, metadata, max_write_seconds: float = 60.0) -> blobsdk.Client:
    """A client over ``metadata``; commits every ``max_write_seconds / 4`` at most, and a link
    older than half of it is made again before its commit (index.py)."""
    blocks = S3BlockStore("blobs", f"sdk-{run_id}", config=services[1].config, allow_http=True)
    write = blobsdk.WriteConfig(chunk_size=CHUNK, max_write_seconds=max_write_seconds)
    return blobsdk.Client.from_stores(metadata, blocks, write=write)


async def test_a_failed_batch_fails_its_objects_and_only_committed_ones_count(services, tmp_path, run_id, monkeypatch):
    from blobsdk.metadata import SqliteMetadataStore
    from blobsdk.ops import index

    monkeypatch.setattr(index, "MAX_BATCH", 5)
    bucket, prefix = lake(services), f"batch-{run_id}"
    await put_objects(bucket, {f"{prefix}/{i:02d}": os.urandom(100) for i in range(12)})
    async with SqliteMetadataStore(tmp_path / "meta.sqlite") as sqlite:
        metadata = CommitsSlowlyOrFails(sqlite, fail_at=2)
        async with store_client(services, tmp_path, run_id, metadata) as c:
            report = await c.index_s3(f"s3://lake/{prefix}", "/b", parallel=1)
            committed = [i.path async for i in c.list("/b/")]
    # Batches are cut by size (5) and by the tick: whichever the failed commit held fail, all of them.
    assert len(committed) == report.indexed == 12 - len(report.failed) and report.bytes_indexed == 100 * report.indexed
    assert 1 <= len(report.failed) <= 5
    assert {why for _, why in report.failed} == {"not committed: metadata down for a moment"}
    assert sorted({url.rsplit("/", 1)[1] for url, _ in report.failed} | {p.rsplit("/", 1)[1] for p in committed}) == [
        f"{i:02d}" for i in range(12)
    ]


async def test_batches_stay_within_the_limit_and_a_blob_written_meanwhile_fails_alone(services, tmp_path, run_id, monkeypatch):
    """Slow commits while four workers add: no commit carries more than MAX_BATCH plans.  A
    blob written by someone else just before the first commit: the transaction is refused
    whole, that object fails, and the rest of its batch is committed."""
    from blobsdk.metadata import SqliteMetadataStore
    from blobsdk.ops import index

    monkeypatch.setattr(index, "MAX_BATCH", 5)
    bucket, prefix = lake(services), f"cap-{run_id}"
    await put_objects(bucket, {f"{prefix}/{i:02d}": os.urandom(10) for i in range(30)})
    async with SqliteMetadataStore(tmp_path / "meta.sqlite") as sqlite:
        metadata = CommitsSlowlyOrFails(sqlite, delay=0.1, write_first=True)
        async with store_client(services, tmp_path, run_id, metadata) as c:
            report = await c.index_s3(f"s3://lake/{prefix}", "/cap", parallel=4)
            committed = [i.path async for i in c.list("/cap/")]
    assert max(metadata.batch_sizes) <= 5
    assert report.indexed == 29 and len(committed) == 30  # 29 indexed, and the other writer's blob
    ((url, why),) = report.failed
    assert why.startswith(f"/cap/{url.rsplit('/', 1)[1]} was written while it was indexed: not replaced (")


async def test_a_commit_in_flight_when_the_last_object_is_read_is_kept(services, tmp_path, run_id):
    """Slow reads (0.3 s) and commits (0.5 s) on a 0.5 s tick: the last objects are read
    while a tick's commit is in flight; every object ends up committed and counted once.
    (Links older than 1 s are made again before a commit: a loaded machine's pauses stay far
    from the 2 s age limit.)"""
    from blobsdk.metadata import SqliteMetadataStore

    bucket, prefix = lake(services), f"tick-{run_id}"
    await put_objects(bucket, {f"{prefix}/{i:02d}": os.urandom(50_000 + i) for i in range(8)})
    async with SqliteMetadataStore(tmp_path / "meta.sqlite") as sqlite:
        metadata = CommitsSlowlyOrFails(sqlite, delay=0.5)
        async with store_client(services, tmp_path, run_id, metadata, max_write_seconds=2.0) as c:
            store = c._open.blocks
            assert isinstance(store, S3BlockStore)
            read_object = store.read_object

            async def slowly(obj, piece_bytes=CHUNK):  # 8 reads over 2 workers: >= 1.2 s, several ticks
                await asyncio.sleep(0.3)
                async for piece in read_object(obj, piece_bytes):
                    yield piece

            store.read_object = slowly  # type: ignore[method-assign]
            seen: list[IndexProgress] = []
            report = await c.index_s3(f"s3://lake/{prefix}", "/t", parallel=2, progress=seen.append)
            assert [i.path async for i in c.list("/t/")] == [f"/t/{i:02d}" for i in range(8)]
    assert (report.indexed, report.failed) == (8, []) and metadata.commits >= 2
    assert [p.objects_done for p in seen] == list(range(9))  # snapshots, one per object read


async def test_directory_markers_of_every_depth_and_of_the_prefix_itself_are_skipped(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"marks-{run_id}"
    await put_objects(bucket, {f"{prefix}/": b"", f"{prefix}/a/": b"", f"{prefix}/a/b/c": b"c", f"{prefix}/e/": b""})
    async with blobsdk.Client(config) as c:
        report = await c.index_s3(f"s3://lake/{prefix}", f"/marks/{run_id}")
        assert (report.objects, report.indexed, report.skipped) == (2, 2, [])
        # obstore lists the empty folder "e/" as "e": to it that is an empty object
        assert [i.path async for i in c.list(f"/marks/{run_id}/")] == [f"/marks/{run_id}/a/b/c", f"/marks/{run_id}/e"]


async def test_a_blob_written_otherwise_at_an_objects_path_is_never_replaced(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"theirs-{run_id}"
    await put_objects(bucket, {f"{prefix}/a": b"lake bytes", f"{prefix}/b": b"more"})
    async with blobsdk.Client(config) as c:
        await c.put(f"/theirs/{run_id}/a", b"put bytes")
        report = await c.index_s3(f"s3://lake/{prefix}", f"/theirs/{run_id}")
        assert report.indexed == 1
        assert report.failed == [
            (f"s3://lake/{prefix}/a", f"/theirs/{run_id}/a holds a blob that was not indexed in place: not replaced")
        ]
        assert await c.get(f"/theirs/{run_id}/a") == b"put bytes"


async def test_an_overlapping_pass_keeps_what_a_later_one_indexed(services, tmp_path, run_id):
    """Pass A lists; then pass B indexes a new object; A, ending, must not take B's blob for
    one whose object is gone (B's link is younger than A)."""
    config = config_of(services, tmp_path, run_id)
    bucket, prefix = lake(services), f"overlap-{run_id}"
    await put_objects(bucket, {f"{prefix}/old": b"old"})
    async with blobsdk.Client(config) as c:
        store = c._open.blocks
        assert isinstance(store, S3BlockStore)
        listing = store.objects

        async def then_pass_b(bucket_name: str, key_prefix: str = ""):
            async for obj in listing(bucket_name, key_prefix):
                yield obj
            store.objects = listing  # type: ignore[method-assign]  # pass B lists for real
            await obstore.put_async(bucket, f"{prefix}/new", b"new")
            assert (await c.index_s3(f"s3://lake/{prefix}", f"/overlap/{run_id}")).indexed == 2

        store.objects = then_pass_b  # type: ignore[method-assign]
        report = await c.index_s3(f"s3://lake/{prefix}", f"/overlap/{run_id}")
        assert report.removed == 0
        assert await c.get(f"/overlap/{run_id}/new") == b"new"


async def test_the_clients_own_l4_cannot_be_indexed_and_a_missing_bucket_is_not_found(services, tmp_path, run_id):
    config = config_of(services, tmp_path, run_id)
    async with blobsdk.Client(config) as c:
        for url in (f"s3://blobs/sdk-{run_id}", f"s3://blobs/sdk-{run_id}/ab", "s3://blobs/"):
            with pytest.raises(blobsdk.BadRequest, match=rf"^{url} overlaps this client's own L4 \(s3://blobs/sdk-{run_id}\)"):
                await c.index_s3(url, "/own")
        assert (await c.index_s3(f"s3://blobs/elsewhere-{run_id}", "/own")).objects == 0
        with pytest.raises(blobsdk.BlobNotFound, match=r"^s3://no-such-lake/x: no such bucket$"):
            await c.index_s3("s3://no-such-lake/x", "/own")
