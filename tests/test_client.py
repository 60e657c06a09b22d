import asyncio

import pytest

import blobsdk
from blobsdk.errors import (
    BlobNotFound,
    ClientClosed,
    CorruptData,
    InvalidPath,
    PreconditionFailed,
)
from tests.conftest import SMALL
from tests.helpers import stored_files


def payload(n: int, seed: int = 0) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


async def test_put_get_round_trip(client):
    data = payload(1_000_000)
    info = await client.put("/b/one.bin", data)
    assert (info.path, info.size, info.version) == ("/b/one.bin", len(data), 1)
    assert info.chunks == 16  # 1,000,000 / 64 KiB, rounded up
    assert await client.get("/b/one.bin") == data


async def test_empty_blob(client):
    info = await client.put("/b/empty", b"")
    assert info.size == 0 and info.chunks == 0
    assert await client.get("/b/empty") == b""
    assert await client.get("/b/empty", offset=5, length=3) == b""


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 1), (65535, 2), (65536, 65536), (100, 300_000), (999_999, 10), (0, None), (500_000, None)],
)
async def test_ranges(client, offset, length):
    data = payload(1_000_000, 1)
    await client.put("/b/r", data)
    end = None if length is None else offset + length
    assert await client.get("/b/r", offset=offset, length=length) == data[offset:end]


async def test_range_past_end_is_short_then_empty(client):
    """The same from the store and from L1 (where a get of one chunk takes no await)."""
    await client.put("/b/r", b"0123456789")
    for _ in range(2):
        hits = client.stats()["l1"]["hits"]
        assert await client.get("/b/r", offset=8, length=10) == b"89"
        assert await client.get("/b/r", offset=10) == b""
        assert await client.get("/b/r", offset=99, length=1) == b""
        assert await client.get("/b/r", offset=3, length=0) == b""
    assert client.stats()["l1"]["hits"] - hits == 1  # the second round: from L1 (an empty range asks no tier)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "from_l1"])
@pytest.mark.parametrize(
    ("offset", "length", "message"),
    [
        (-1, None, "offset must be an int >= 0, got -1"),
        (0, -2, "length must be None or an int >= 0, got -2"),
        (1.5, None, "offset must be an int >= 0, got 1.5"),
        (0, "3", "length must be None or an int >= 0, got '3'"),
    ],
)
async def test_a_bad_range_is_refused(client, warm, offset, length, message):
    await client.put("/b/r", b"0123456789")
    if warm:
        assert await client.get("/b/r") == b"0123456789"
    with pytest.raises(ValueError) as exc:
        await client.get("/b/r", offset=offset, length=length)
    assert str(exc.value) == message


async def test_compressible_data_is_stored_compressed(client, tmp_path):
    data = b"the same words again and again " * 40_000
    await client.put("/b/text", data)
    stored = sum(f.stat().st_size for f in stored_files(tmp_path / "data" / "blocks"))
    assert stored < len(data) / 5
    assert await client.get("/b/text") == data
    assert await client.get("/b/text", offset=70_000, length=100_000) == data[70_000:170_000]


async def test_versions_and_cas(client):
    assert (await client.put("/b/v", b"1")).version == 1
    assert (await client.put("/b/v", b"2", if_version=1)).version == 2
    with pytest.raises(PreconditionFailed):
        await client.put("/b/v", b"3", if_version=1)
    with pytest.raises(PreconditionFailed):
        await client.put("/b/v", b"3", if_version=0)
    assert await client.get("/b/v") == b"2"
    assert (await client.put("/b/new", b"x", if_version=0)).version == 1


async def test_missing(client):
    with pytest.raises(BlobNotFound):
        await client.get("/b/missing")
    with pytest.raises(BlobNotFound):
        await client.stat("/b/missing")
    with pytest.raises(BlobNotFound):
        await client.delete("/b/missing")


@pytest.mark.parametrize("bad", ["", "rel/x", "/", "/b/../x", "/b/./x", "/b//x", "/b/x\x00", "/b/" + "x" * 1022])
async def test_invalid_paths_everywhere(client, bad):
    for call in (client.get(bad), client.put(bad, b"x"), client.stat(bad), client.delete(bad)):
        with pytest.raises(InvalidPath):
            await call


async def test_list_stat_delete(client):
    for name in ["/b/a/2", "/b/a/1", "/b/ab", "/c/x"]:
        await client.put(name, name.encode())
    assert [i.path async for i in client.list("/b/a/")] == ["/b/a/1", "/b/a/2"]
    assert [i.path async for i in client.list("/b/a")] == ["/b/a/1", "/b/a/2", "/b/ab"]
    assert (await client.stat("/b/ab")).size == 5
    deleted = await client.delete("/b/ab")
    assert deleted.path == "/b/ab"
    assert [i.path async for i in client.list("/b/")] == ["/b/a/1", "/b/a/2"]
    with pytest.raises(InvalidPath):
        [i async for i in client.list("b/")]


async def test_a_bare_bucket_lists_that_bucket_only(client):
    """issue 22 CLI item 2: ``/b`` is bucket ``b``, not every bucket whose name starts with b."""
    for name in ["/b/x", "/b/y/z", "/b2/z", "/bx/k", "/c/x"]:
        await client.put(name, b"1")
    assert [i.path async for i in client.list("/b")] == ["/b/x", "/b/y/z"]
    assert [i.path async for i in client.list("/b", start_after="/b/x")] == ["/b/y/z"]
    assert [i.path async for i in client.list("/")] == ["/b/x", "/b/y/z", "/b2/z", "/bx/k", "/c/x"]


@pytest.mark.parametrize("path", ["/bucketx", "/b/"])
async def test_a_put_or_get_of_a_path_with_no_key_is_refused(client, path):
    with pytest.raises(InvalidPath) as put:
        await client.put(path, b"x")
    with pytest.raises(InvalidPath) as get:
        await client.get(path)
    assert str(put.value) == str(get.value)
    if path == "/bucketx":
        assert str(put.value) == "path '/bucketx' names a bucket, not a blob: a blob path is /bucket/key"


@pytest.mark.parametrize("data", ["a str", 7, None])
async def test_put_of_data_that_is_not_bytes_like_names_the_argument(client, data):
    with pytest.raises(TypeError) as caught:
        await client.put("/b/x", data)
    assert str(caught.value) == (
        f"put: data must be a bytes-like object (bytes, bytearray, memoryview, ...), not {type(data).__name__}"
    )
    assert [i async for i in client.list("/b/")] == []


async def test_put_many_packs_and_reports_progress(client, tmp_path):
    items = [(f"/ds/s{i:04d}", payload(3000 + i, i)) for i in range(300)]
    seen = []
    infos = await client.put_many(iter(items), progress=lambda n, b: seen.append((n, b)))
    assert [i.path for i in infos] == [p for p, _ in items]
    assert seen[-1] == (300, sum(len(d) for _, d in items))
    blocks = stored_files(tmp_path / "data" / "blocks")
    assert len(blocks) <= 5  # ~1 MiB of samples in 256 KiB blocks
    for path, data in items[::37]:
        assert await client.get(path) == data


async def test_put_many_async_iterable_and_repeated_path(client):
    async def gen():
        for i in range(5):
            yield "/ds/same", str(i).encode()

    infos = await client.put_many(gen())
    assert [i.version for i in infos] == [1, 2, 3, 4, 5]
    assert await client.get("/ds/same") == b"4"


async def test_put_many_bad_path_stops_with_invalid_path(client):
    with pytest.raises(InvalidPath):
        await client.put_many([("/ds/ok", b"1"), ("nope", b"2")])


async def test_flipped_byte_is_never_returned(client, tmp_path):
    await client.put("/b/c", payload(200_000, 3))
    block = stored_files(tmp_path / "data" / "blocks")[0]
    raw = bytearray(block.read_bytes())
    raw[1000] ^= 0xFF
    block.write_bytes(raw)
    with pytest.raises(CorruptData, match="no replica returned bytes matching its checksum"):
        await client.get("/b/c")
    assert await client.get("/b/c", offset=100_000, length=10) == payload(200_000, 3)[100_000:100_010]
    assert client.stats()["l4"]["corrupt"] >= 1


async def test_concurrent_gets(client):
    blobs = {f"/b/{i}": payload(150_000, i) for i in range(20)}
    for path, data in blobs.items():
        await client.put(path, data)
    results = await asyncio.gather(*(client.get(p) for p in blobs))
    assert results == list(blobs.values())
    stats = client.stats()["l4"]
    assert stats["hits"] == 20 * 3 and stats["bytes"] == 20 * 150_000


async def test_closed_client(tmp_path):
    c = blobsdk.Client.local(tmp_path)
    with pytest.raises(ClientClosed, match="client is not open"):
        await c.get("/b/x")
    async with c:
        await c.put("/b/x", b"1")
    with pytest.raises(ClientClosed):
        await c.get("/b/x")


async def test_reopen_keeps_data(tmp_path):
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        await c.put("/b/keep", b"kept")
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        assert await c.get("/b/keep") == b"kept"


def test_sync_client(tmp_path):
    with blobsdk.SyncClient.local(tmp_path, write=SMALL) as c:
        c.put("/b/s", b"sync")
        assert c.get("/b/s") == b"sync"
        assert c.get("/b/s", 1, 2) == b"yn"
        assert [i.path for i in c.list("/b/")] == ["/b/s"]
        assert c.stat("/b/s").size == 4
        assert len(c.put_many([("/b/m1", b"1"), ("/b/m2", b"2")])) == 2
        c.delete("/b/s")
        with pytest.raises(BlobNotFound):
            c.get("/b/s")
        assert "l4" in c.stats()
    with pytest.raises(ClientClosed, match="SyncClient is not open"):
        c.get("/b/m1")


async def test_corrupt_replica_is_skipped_for_a_good_one(tmp_path):
    from blobsdk.metadata import SqliteMetadataStore
    from blobsdk.sources import LocalBlockStore, ReplicatedBlockStore

    data = payload(300_000, 9)
    async with (
        SqliteMetadataStore(tmp_path / "m.sqlite") as meta,
        LocalBlockStore(tmp_path / "r0") as r0,
        LocalBlockStore(tmp_path / "r1") as r1,
    ):
        blocks = ReplicatedBlockStore([r0, r1])
        async with blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c:
            await c.put("/b/rep", data)
            plan = await c._open.plans.get_plan("/b/rep")
            l4 = next(t for t in c._open.readpath.tiers if t.name == "l4")
            first = l4.candidates(plan.chunks[0].key)[0]  # read first for chunk 0: corrupt that one
            for f in stored_files(first.root):
                raw = bytearray(f.read_bytes())
                for i in range(0, len(raw), 4096):  # a flip in every chunk
                    raw[i] ^= 1
                f.write_bytes(raw)
            assert await c.get("/b/rep") == data
            stats = c.stats()["l4"]
            assert stats["corrupt"] >= 1 and stats["hits"] == 5
        await blocks.aclose()


async def test_put_many_with_empty_blobs_between(client):
    items = [("/b/small", b"x"), ("/b/empty", b""), ("/b/big", bytes(range(256)) * 4096), ("/b/empty2", b"")]
    infos = await client.put_many(items)
    assert [i.size for i in infos] == [1, 0, 1 << 20, 0]
    for path, data in items:
        assert await client.get(path) == data


def test_a_config_that_names_no_stores_is_refused_at_construction():
    refused = (
        r"^no stores configured: need api_url \(or metadata_url\) and block_urls \(or source_url\), or use Client.local\(DIR\)$"
    )
    with pytest.raises(ValueError, match=refused):
        blobsdk.Client(blobsdk.ClientConfig())


def test_block_urls_without_an_api_url_are_refused():
    refused = r"^L4 needs its metadata: an api_url \(the metadata API server\) or a metadata_url \(Redis\)$"
    with pytest.raises(ValueError, match=refused):
        blobsdk.ClientConfig(block_urls=("http://b",))


def test_sync_client_local_takes_the_same_tiers_as_client_local(tmp_path):
    l2 = blobsdk.L2Config(dir=str(tmp_path / "l2"))
    with blobsdk.SyncClient.local(tmp_path / "data", write=SMALL, l1=blobsdk.L1Config(capacity_bytes=0), l2=l2) as c:
        c.put("/b/x", b"tiered")
        assert c.get("/b/x") == b"tiered"
        c.flush()
        stats = c.stats()
    assert stats["l1"]["enabled"] is False and stats["l2"]["enabled"] is True
    assert stored_files(tmp_path / "l2")  # the chunk went to L2


async def test_every_tier_is_closed_with_the_client(tmp_path):
    l2 = blobsdk.L2Config(dir=str(tmp_path / "l2"))
    async with blobsdk.Client.local(tmp_path / "data", write=SMALL, l2=l2) as c:
        tiers = c._open.readpath.tiers
        l2_tier = next(t for t in tiers if t.name == "l2")
        assert l2_tier._writers and not any(w.done() for w in l2_tier._writers)
    assert not l2_tier._writers
