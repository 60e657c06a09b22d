"""blobsdk/metadata/_redis.py against real redis-server processes: the conformance suite on a
single server and on a three-master Redis Cluster, and the faults (a killed server, a
restart)."""

from __future__ import annotations

import asyncio
import gc
import secrets
import time

import pytest
from redis.asyncio.connection import AbstractConnection

from blobsdk._redisurl import FORM
from blobsdk.chunks import bucket_of
from blobsdk.errors import BadRequest, BlobNotFound, ClientClosed, CorruptData, Unavailable, Unreachable
from blobsdk.metadata import RedisMetadataStore
from blobsdk.metadata.base import MetadataStore, check_commit_op
from blobsdk.testing.metadata import MetadataStoreTests
from blobsdk.testing.plans import make_plan, put, put_all
from blobsdk.wire import CommitOp
from servers.redisd import start_redis, start_redis_cluster


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    with start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"), masters=3) as cluster:
        yield cluster


def namespace() -> str:
    """A fresh namespace per test: the servers are shared by a module's tests."""
    return f"t{secrets.token_hex(6)}"


class TestRedisMetadataStore(MetadataStoreTests):
    @pytest.fixture
    async def store(self, redis_server):
        async with RedisMetadataStore(redis_server.url, namespace=namespace()) as store:
            assert store.cluster is False
            yield store


class PerBucket:
    """The store, with a batch of several buckets' paths committed one bucket at a time: the
    suite's fixtures put several buckets in one batch, which a cluster refuses (its rule)."""

    def __init__(self, store: RedisMetadataStore) -> None:
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def commit_many(self, ops):
        for op in ops:
            check_commit_op(op)  # bad input is the store's to refuse, as a whole batch
        buckets = {bucket_of(op.path) for op in ops}
        if len(buckets) < 2:
            return await self.store.commit_many(ops)
        done = {}
        for bucket in sorted(buckets):
            mine = [op for op in ops if bucket_of(op.path) == bucket]
            done.update(zip(map(id, mine), await self.store.commit_many(mine), strict=True))
        return [done[id(op)] for op in ops]


class TestRedisClusterMetadataStore(MetadataStoreTests):
    """The same suite on a three-master cluster."""

    @pytest.fixture
    async def store(self, redis_cluster):
        async with RedisMetadataStore(redis_cluster.url, namespace=namespace()) as store:
            assert store.cluster is True
            yield PerBucket(store)


async def test_is_a_metadata_store(redis_server):
    assert isinstance(RedisMetadataStore(redis_server.url), MetadataStore)


async def test_a_listing_spans_the_slots_of_many_buckets(redis_cluster):
    """Buckets hash to slots on all three masters; one listing walks them in path order."""
    async with RedisMetadataStore(redis_cluster.url, namespace=namespace()) as store:
        paths = [f"/bucket{i:02d}/k{j}" for i in range(30) for j in range(3)]
        for i in range(30):
            await store.commit_many([CommitOp(path=p, plan=make_plan(p)) for p in paths[i * 3 : i * 3 + 3]])
        slots = {await store._redis.cluster_keyslot(store._keys.index(f"bucket{i:02d}")) for i in range(30)}
        nodes = {store._redis.get_node_from_key(store._keys.index(f"bucket{i:02d}")).name for i in range(30)}
        assert len(slots) == 30 and len(nodes) == 3
        assert [info.path async for info in store.list("/", limit=7)] == sorted(paths)
        assert [info.path async for info in store.list("/bucket1")] == sorted(p for p in paths if p.startswith("/bucket1"))
        assert [plan.path async for plan in store.iter_plans()] == sorted(paths)


async def test_on_a_cluster_a_commit_across_buckets_is_refused(redis_cluster):
    async with RedisMetadataStore(redis_cluster.url, namespace=namespace()) as store:
        ops = [CommitOp(path="/a/x", plan=make_plan("/a/x")), CommitOp(path="/b/x", plan=make_plan("/b/x"))]
        with pytest.raises(
            BadRequest, match=r"^on Redis Cluster a commit's paths must share their bucket; these are in \['a', 'b'\]$"
        ):
            await store.commit_many(ops)
        assert await store.get_plans(["/a/x", "/b/x"]) == [None, None]


async def test_a_single_server_commits_across_buckets_atomically(redis_server):
    async with RedisMetadataStore(redis_server.url, namespace=namespace()) as store:
        ops = [CommitOp(path="/a/x", plan=make_plan("/a/x")), CommitOp(path="/b/x", plan=make_plan("/b/x"))]
        assert [p.version for p in await store.commit_many(ops)] == [1, 1]
        assert [i.path async for i in store.list("/")] == ["/a/x", "/b/x"]


async def test_bad_urls_and_namespaces_are_refused():
    with pytest.raises(ValueError) as caught:
        RedisMetadataStore("http://x")
    assert str(caught.value) == f"a Redis metadata URL must be {FORM}, got 'http://x'"
    with pytest.raises(ValueError, match=r"^namespace must be non-empty and without braces, got 'a\{b'$"):
        RedisMetadataStore("redis://127.0.0.1:1/0", namespace="a{b")


async def test_a_server_nobody_listens_on_is_unavailable_fast():
    store = RedisMetadataStore("redis://:secret@127.0.0.1:1/0", timeout=1.0)
    begun = time.monotonic()
    with pytest.raises(Unreachable) as info:  # an Unavailable
        await store.get_plan("/b/x")
    assert str(info.value) == (  # and no password
        "cannot reach Redis at 127.0.0.1:1 (the metadata store): connection refused"
        " (nothing listens there: Redis is not running there, or metadata_url is wrong)"
    )
    assert time.monotonic() - begun < 5
    await store.aclose()
    with pytest.raises(ClientClosed):
        await store.get_plan("/b/x")


async def test_a_killed_server_is_unavailable_not_a_hang_and_a_restart_serves_again(tmp_path):
    with start_redis(tmp_path / "r", durable=True) as server:
        async with RedisMetadataStore(server.url, namespace="ns", timeout=1.0) as store:
            await put(store, "/b/x")
            server.stop()
            begun = time.monotonic()
            for call in (lambda: store.get_plan("/b/x"), lambda: put(store, "/b/y"), lambda: store.list_page("/b/")):
                with pytest.raises(Unavailable):
                    await call()
            assert time.monotonic() - begun < 10
            server.start()  # the same port; the append-only file brings /b/x back
            assert (await store.get_plan("/b/x")).version == 1
            assert (await put(store, "/b/y")).version == 1
            with pytest.raises(BlobNotFound):
                await store.get_plan("/b/z")


async def test_concurrent_commits_from_two_stores_keep_versions_monotonic(redis_server):
    ns = namespace()
    async with RedisMetadataStore(redis_server.url, namespace=ns) as a, RedisMetadataStore(redis_server.url, namespace=ns) as b:
        results = await asyncio.gather(*(put(s, "/b/x", seed=i) for i, s in enumerate([a, b] * 10)))
        assert sorted(p.version for p in results) == list(range(1, 21))
        assert (await b.get_plan("/b/x")).version == 20


# redis-py's cluster client, refreshing its view after a node failed, drops the old node
# objects with their connections open (closed only by the garbage collector, with a
# ResourceWarning): collected here, inside the test, and those warnings let pass.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_a_cluster_with_a_master_down_is_unavailable_not_a_hang(tmp_path):
    await _cluster_with_a_master_down(tmp_path)
    gc.collect()


async def _cluster_with_a_master_down(tmp_path):
    with start_redis_cluster(tmp_path / "c", masters=3) as cluster:
        async with RedisMetadataStore(cluster.url, namespace="ns", timeout=1.0) as store:
            down = cluster.servers[2]
            on_it = next(f"/bucket{i}/x" for i in range(100) if _node_of(store, f"bucket{i}") == down.port)
            await put(store, on_it)
            down.stop()
            begun = time.monotonic()
            with pytest.raises(Unavailable):
                await store.get_plan(on_it)
            with pytest.raises(Unavailable):
                await put(store, on_it, seed=1)
            assert time.monotonic() - begun < 30


def _node_of(store: RedisMetadataStore, bucket: str) -> int:
    return int(store._redis.get_node_from_key(store._keys.index(bucket)).port)


@pytest.mark.parametrize(
    ("field", "stored", "why"),
    [
        ("plan", b"\xc1", "MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)"),
        ("plan", b"\x01", "Expected `object`, got `int`"),
        ("v", b"two", "invalid literal for int() with base 10: b'two'"),
        ("t", b"noon", "could not convert string to float: b'noon'"),
    ],
    ids=["malformed", "not-a-plan", "version", "created"],
)
async def test_a_hash_field_overwritten_is_corrupt_data_naming_the_path(redis_server, field, stored, why):
    """issue 20 item 7: the decoder's own exception (a ValueError) never escapes."""
    async with RedisMetadataStore(redis_server.url, namespace=namespace()) as store:
        await put(store, "/b/x")
        await put(store, "/b/y")
        await (await store._client()).hset(store._keys.path("/b/x"), field, stored)
        for lookup in (lambda: store.get_plan("/b/x"), lambda: store.get_plans(["/b/y", "/b/x"]), store.scan_page):
            with pytest.raises(CorruptData) as exc:
                await lookup()
            assert str(exc.value) == f"the stored plan of '/b/x' is corrupt: {why}"
        assert (await store.get_plan("/b/y")).version == 1


async def test_a_namespace_written_before_the_block_index_is_indexed_at_open(redis_server):
    """Plans committed by a build without the reverse index (no ``blocks`` field, no ``b:``
    sets, no ``ns:refs``) are put into it by the first store of this build to open."""
    ns = namespace()
    async with RedisMetadataStore(redis_server.url, namespace=ns) as store:
        for i in range(1, 1203):  # past one page of the pass
            await put(store, f"/b{i % 2}/x{i}", seed=1 + i % 3)
        client = await store._client()
        for key in [k async for k in client.scan_iter(match=f"{ns}:*:b:*")]:
            await client.delete(key)
        async for key in client.scan_iter(match=f"{ns}:*:p:*"):
            await client.hdel(key, "blocks")
        await client.delete(f"{ns}:refs")
    async with RedisMetadataStore(redis_server.url, namespace=ns) as store:
        found = sorted({p.path async for p in store.iter_naming([f"{1:032x}"])})
        assert found == sorted(f"/b{i % 2}/x{i}" for i in range(1, 1203) if i % 3 == 0)
        await put(store, "/b0/x6", seed=2)  # an overwrite drops the reference the pass added
        assert "/b0/x6" not in {p.path async for p in store.iter_naming([f"{1:032x}"])}
        assert await (await store._client()).get(f"{ns}:refs") == b"1"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (("hset", "size", b"big"), "invalid literal for int() with base 10: 'big'"),
        (("hset", "t", b"noon"), "could not convert string to float: 'noon'"),
        (("hdel", "v"), "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'"),
    ],
    ids=["size", "created", "version-gone"],
)
async def test_a_listed_field_damaged_is_corrupt_data_naming_the_path(redis_server, damage, why):
    async with RedisMetadataStore(redis_server.url, namespace=namespace()) as store:
        await put_all(store, ["/b/w", "/b/x", "/b/y"])
        command, field, *value = damage
        await getattr(await store._client(), command)(store._keys.path("/b/x"), field, *value)
        with pytest.raises(CorruptData) as exc:
            await store.list_page("/b/")
        assert str(exc.value) == f"the stored plan of '/b/x' is corrupt: {why}"
        assert [info.path for info in (await store.list_page("/b/", limit=1))[0]] == ["/b/w"]


class Replies:
    """Counts the replies the store's connections read (each one a command answered):
    redis-py parses every reply in Python, element by element, so this is a listing's cost."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        read = AbstractConnection.read_response

        async def counted(connection, *args, **kwargs):
            self.count += 1
            return await read(connection, *args, **kwargs)

        monkeypatch.setattr(AbstractConnection, "read_response", counted)


async def test_a_listing_page_is_one_command_whatever_its_size(redis_server, monkeypatch):
    """issue 27: a 100-entry page was 101 replies (the index range, then one HMGET per
    entry, pipelined), 190 µs an entry at 10^6 paths; now one script call per page."""
    async with RedisMetadataStore(redis_server.url, namespace=namespace()) as store:
        paths = [f"/b/k{i:03d}" for i in range(250)]
        for first in range(0, 250, 50):
            await store.commit_many([CommitOp(path=p, plan=make_plan(p)) for p in paths[first : first + 50]])
        replies = Replies(monkeypatch)
        page, cursor = await store.list_page("/b/", limit=100)
        assert [info.path for info in page] == paths[:100] and cursor == paths[99]
        assert replies.count == 1
        page, cursor = await store.list_page("/b/k1", cursor, limit=100)
        assert [info.path for info in page] == paths[100:200] and cursor is None
        assert replies.count == 2
        assert [info.path async for info in store.list("/b/", limit=100)] == paths
        assert replies.count == 5  # three pages


async def test_a_listing_page_across_buckets_is_one_command_per_bucket(redis_server, monkeypatch):
    """The bucket list, then a script call per bucket until the page is full (the last call
    reads one path more, to know whether a next page starts there)."""
    async with RedisMetadataStore(redis_server.url, namespace=namespace()) as store:
        await put_all(store, [f"/{b}/k{i}" for b in "abc" for i in range(3)])
        replies = Replies(monkeypatch)
        page, cursor = await store.list_page("/", limit=3)
        assert [info.path for info in page] == ["/a/k0", "/a/k1", "/a/k2"] and cursor == "/a/k2"
        assert replies.count == 3  # buckets, a (three listed, no fourth), b (one read: there is more)
        page, cursor = await store.list_page("/", cursor, limit=5)
        assert [info.path for info in page] == ["/b/k0", "/b/k1", "/b/k2", "/c/k0", "/c/k1"] and cursor == "/c/k1"
        page, cursor = await store.list_page("/", cursor, limit=5)
        assert [info.path for info in page] == ["/c/k2"] and cursor is None


async def test_a_call_to_a_server_that_never_answers_is_tried_once():
    """The store's timeout bounds a call: a timeout is not tried again (a failed connection is,
    once: blobsdk/metadata/_redis_connect.py)."""
    accepted = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read()  # reads the command, never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        store = RedisMetadataStore(f"redis://127.0.0.1:{port}/0", timeout=0.2)
        with pytest.raises(Unavailable) as caught:
            await store.open()
        assert str(caught.value).startswith(f"metadata store redis://127.0.0.1:{port}/0: Timeout")
        assert accepted == 1
        await store.aclose()
    finally:
        server.close()
        await server.wait_closed()
