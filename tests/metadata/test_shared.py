"""blobsdk/metadata/_shared.py: the shared read-plan cache in a real redis-server, in front of a
real SQLite store (counted, to see which reads reached it)."""

from __future__ import annotations

import asyncio
import secrets
import time

import msgspec
import pytest

from blobsdk.errors import CorruptData
from blobsdk.metadata import SharedPlanCache, SqliteMetadataStore
from blobsdk.metadata.base import MetadataStore
from blobsdk.testing.metadata import MetadataStoreTests
from blobsdk.testing.plans import bad_plan, make_plan, put
from servers.redisd import start_redis

from .late import LateAnswers


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


class Counting(SqliteMetadataStore):
    reads = 0

    async def get_plans(self, paths):
        self.reads += len(paths)
        return await super().get_plans(paths)

    async def get_plan(self, path):
        self.reads += 1
        return await super().get_plan(path)


@pytest.fixture
async def backing(tmp_path):
    async with Counting(tmp_path / "m.sqlite") as store:
        yield store


@pytest.fixture
async def opened():
    """The caches a test made, closed after it (each closes its Redis connections)."""
    made: list[SharedPlanCache] = []
    yield made
    for shared in made:
        await shared.aclose()


@pytest.fixture
def cache(opened, redis_server):
    def make(store, ns: str, **kwargs) -> SharedPlanCache:
        opened.append(SharedPlanCache(store, redis_server.url, namespace=ns, **kwargs))
        return opened[-1]

    return make


class TestSharedPlanCache(MetadataStoreTests):
    """The shared plan cache in front of SQLite (a namespace of its own per test) is a
    MetadataStore like the store itself."""

    @pytest.fixture
    async def store(self, backing, cache):
        return cache(backing, secrets.token_hex(4))


async def test_a_plan_one_client_read_is_served_to_the_next_from_redis(backing, cache):
    ns = secrets.token_hex(4)
    first, second = cache(backing, ns), cache(backing, ns)
    assert isinstance(first, MetadataStore)
    committed = await put(backing, "/b/x")
    assert await first.get_plan("/b/x") == committed and backing.reads == 1
    assert await second.get_plan("/b/x") == committed and backing.reads == 1  # from Redis
    assert await second.get_plans(["/b/x", "/b/missing", "/b/x"]) == [committed, None, committed]
    assert backing.reads == 2  # only the missing one; a missing path is never cached
    assert second.stats() == {"hits": 3, "misses": 1, "errors": 0}


async def test_a_commit_through_the_cache_is_seen_by_every_client_at_once(backing, cache):
    ns = secrets.token_hex(4)
    writer, reader, other_tenant = (cache(backing, ns, token=t) for t in ("a", "b", "c"))
    await put(backing, "/b/x")
    await reader.get_plan("/b/x")
    await other_tenant.get_plan("/b/x")
    newer = await writer.commit("/b/x", make_plan("/b/x", seed=5), if_version=1)
    reads = backing.reads
    assert await reader.get_plan("/b/x") == newer and await other_tenant.get_plan("/b/x") == newer
    assert backing.reads == reads + 2  # the old entries of both scopes were invalidated by the bump
    await writer.delete("/b/x")
    assert await reader.get_plans(["/b/x"]) == [None]


async def test_tokens_never_share_an_entry_and_entries_expire(backing, cache):
    ns = secrets.token_hex(4)
    await put(backing, "/b/x")
    a, b = cache(backing, ns, token="a", ttl_seconds=0.3), cache(backing, ns, token="b")
    await a.get_plan("/b/x")
    await b.get_plan("/b/x")
    assert backing.reads == 2  # b's token may not see a's plan (its grants are a's)
    await a.get_plan("/b/x")
    assert backing.reads == 2
    await asyncio.sleep(0.4)
    await a.get_plan("/b/x")
    assert backing.reads == 3


async def test_a_plan_whose_grants_are_about_to_expire_is_not_served(backing, cache):
    ns = secrets.token_hex(4)
    shared = cache(backing, ns)
    plan = msgspec.structs.replace(await put(backing, "/b/x"), grants_expire=time.time() + 1)  # inside the margin
    await shared._put([(plan, 0)])
    assert await shared._cached(["/b/x"]) == [(None, 0)]


async def test_a_bad_plan_in_the_shared_redis_is_corrupt_data(backing, cache):
    """Whoever can write the cache's Redis can put a plan there: it is checked where it
    enters, the cache's read of Redis, as a plan from any metadata store is."""
    shared = cache(backing, secrets.token_hex(4))
    await put(backing, "/b/x")
    await shared._put([(bad_plan("/b/x", {"size": 10, "chunks": ()}), 0)])
    for call in (lambda: shared.get_plan("/b/x"), lambda: shared.get_plans(["/b/x"])):
        with pytest.raises(CorruptData) as exc:
            await call()
        assert str(exc.value) == "metadata store returned an invalid plan: plan for '/b/x': chunks cover 0 bytes, size is 10"
    assert backing.reads == 0


async def test_with_redis_down_reads_and_writes_go_to_the_store(backing, tmp_path, opened):
    with start_redis(tmp_path / "r") as server:
        shared = SharedPlanCache(backing, server.url, timeout=0.5)
        opened.append(shared)
        await put(backing, "/b/x")
        await shared.get_plan("/b/x")
        server.stop()
        begun = time.monotonic()
        assert (await shared.get_plan("/b/x")).version == 1
        assert (await shared.commit("/b/y", make_plan("/b/y"))).version == 1
        assert time.monotonic() - begun < 5 and shared.errors >= 2


async def test_bad_settings_are_refused(backing):
    with pytest.raises(ValueError, match=r"^shared plan cache needs ttl_seconds > 0, got 0$"):
        SharedPlanCache(backing, "redis://127.0.0.1:1/0", ttl_seconds=0)


async def test_an_answer_that_left_before_a_commit_is_never_served_after_it(tmp_path, cache):
    """A reader's lookup reads version 1, a writer commits version 2 through the cache, then
    the reader's answer arrives and is cached: at the generation read before the lookup, so
    the commit's bump has already made it unusable (issue 20 item 1)."""
    ns = secrets.token_hex(4)
    async with LateAnswers(tmp_path / "late.sqlite") as late:
        await put(late, "/b/x")
        reader, writer = cache(late, ns), cache(late, ns)
        asking = asyncio.ensure_future(reader.get_plan("/b/x"))
        await late.asked.wait()
        newer = await writer.commit("/b/x", make_plan("/b/x", seed=5))
        late.release.set()
        assert (await asking).version == 1  # it left before the commit
        assert await reader.get_plan("/b/x") == newer and await writer.get_plans(["/b/x"]) == [newer]


async def test_a_damaged_entry_is_a_miss_not_an_exception(backing, cache):
    """issue 20 item 7: a value under the cache's key that does not decode is counted in
    ``errors`` and read from the store, never msgspec's DecodeError."""
    shared = cache(backing, secrets.token_hex(4))
    committed = await put(backing, "/b/x")
    await shared.get_plan("/b/x")
    await shared._redis.set(shared._keys("/b/x")[1], b"\xc1")
    assert await shared.get_plan("/b/x") == committed
    assert shared.stats() == {"hits": 0, "misses": 2, "errors": 1} and backing.reads == 2
