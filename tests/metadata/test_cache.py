"""The plan cache: a plan the store answers is checked before anyone reads through it."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from blobsdk import Client, auth
from blobsdk.errors import BlobNotFound, CorruptData
from blobsdk.metadata import CachedMetadataStore, SqliteMetadataStore
from blobsdk.testing.metadata import MetadataStoreTests
from blobsdk.testing.plans import bad_plan, make_plan, put

from .late import LateAnswers
from .unchecked import plant_plan

NO_CHUNKS = "metadata store returned an invalid plan: plan for '/b/x': chunks cover 0 bytes, size is 10"


class OtherPathStore(SqliteMetadataStore):
    """A backend whose lookups answer the plan of another path, as a confused server might:
    the plan is refused where it enters (blobsdk/metadata/backend.py), before the cache."""

    async def _get_plan(self, path):
        return await super()._get_plan("/b/other")

    async def _get_plans(self, paths):
        return await super()._get_plans(["/b/other"] * len(paths))


class TestCachedMetadataStore(MetadataStoreTests):
    """The plan cache in front of SQLite is a MetadataStore like the store itself."""

    @pytest.fixture
    async def store(self, tmp_path):
        async with SqliteMetadataStore(tmp_path / "meta.sqlite") as backing:
            yield CachedMetadataStore(backing)


@pytest.fixture
async def planted(tmp_path):
    """A metadata file (an embedded client's root/meta.sqlite) whose '/b/x' plan has size 10
    and no chunks."""
    db = tmp_path / "root" / "meta.sqlite"
    db.parent.mkdir()
    await plant_plan(db, "/b/x", bad_plan("/b/x", {"size": 10, "chunks": ()}))
    return db


async def test_a_bad_stored_plan_is_corrupt_data_and_not_cached(planted):
    async with SqliteMetadataStore(planted) as store:
        cache = CachedMetadataStore(store)
        for _ in range(2):
            with pytest.raises(CorruptData) as exc:
                await cache.get_plan("/b/x")
            assert str(exc.value) == NO_CHUNKS
        with pytest.raises(CorruptData, match="chunks cover 0 bytes"):
            await cache.get_plans(["/b/x"])
        assert cache.peek("/b/x") is None and cache.stats()["entries"] == 0


async def test_a_plan_of_another_path_is_corrupt_data(tmp_path):
    async with OtherPathStore(tmp_path / "m.sqlite") as store:
        await put(store, "/b/other")
        cache = CachedMetadataStore(store)
        message = "metadata store returned an invalid plan: plan for '/b/other', not for '/b/x'"
        with pytest.raises(CorruptData) as exc:
            await cache.get_plan("/b/x")
        assert str(exc.value) == message
        with pytest.raises(CorruptData, match="not for '/b/x'"):
            await cache.get_plans(["/b/x"])
        assert cache.peek("/b/x") is None and cache.peek("/b/other") is None


async def test_valid_plans_are_cached(tmp_path):
    async with SqliteMetadataStore(tmp_path / "m.sqlite") as store:
        cache = CachedMetadataStore(store)
        committed = await cache.commit("/b/x", make_plan("/b/x"))
        assert cache.peek("/b/x") == committed == await cache.get_plan("/b/x")


async def test_client_get_of_a_bad_plan_is_corrupt_data_not_zeros(planted):
    async with Client.local(planted.parent) as client:
        with pytest.raises(CorruptData, match="chunks cover 0 bytes, size is 10"):
            await client.get("/b/x")
        with pytest.raises(CorruptData, match="chunks cover 0 bytes, size is 10"):
            await client.get("/b/x", 0, 4)


# --- late answers (issue 20 item 1) ------------------------------------------------------


def lookup(cache: CachedMetadataStore, path: str, batch: bool):
    """``get_plans([path])`` or ``get_plan(path)``, as one awaitable of a plan or None."""

    async def one():
        if batch:
            return (await cache.get_plans([path]))[0]
        try:
            return await cache.get_plan(path)
        except BlobNotFound:
            return None

    return asyncio.ensure_future(one())


@pytest.fixture
async def late(tmp_path):
    async with LateAnswers(tmp_path / "m.sqlite") as store:
        yield store


def no_record_left(cache: CachedMetadataStore) -> bool:
    """Nothing in flight, no newest-version record kept (memory is bounded)."""
    return cache._in_flight == {} and cache._newest == {}


@pytest.mark.parametrize("batch", [False, True], ids=["get_plan", "get_plans"])
async def test_an_answer_older_than_the_clients_own_commit_never_hides_it(late, batch):
    await put(late, "/b/x")  # version 1, written by someone else: not cached here
    cache = CachedMetadataStore(late)
    asking = lookup(cache, "/b/x", batch)
    await late.asked.wait()  # the lookup read version 1 ...
    newer = await cache.commit("/b/x", make_plan("/b/x", seed=5))  # ... then our version 2 commits
    late.release.set()  # ... then the lookup's answer arrives
    assert (await asking) == newer and newer.version == 2
    assert cache.peek("/b/x") == newer
    assert await cache.get_plan("/b/x") == newer and await cache.get_plans(["/b/x"]) == [newer]
    assert no_record_left(cache)


@pytest.mark.parametrize("batch", [False, True], ids=["get_plan", "get_plans"])
async def test_an_answer_older_than_the_clients_own_delete_never_resurrects_it(late, batch):
    await put(late, "/b/x")
    cache = CachedMetadataStore(late)
    asking = lookup(cache, "/b/x", batch)
    await late.asked.wait()
    assert (await cache.delete("/b/x")).version == 1
    late.release.set()
    assert (await asking) is None
    assert cache.peek("/b/x") is None
    with pytest.raises(BlobNotFound, match=r"^no blob at '/b/x'$"):
        await cache.get_plan("/b/x")
    assert await cache.get_plans(["/b/x"]) == [None]
    assert no_record_left(cache)


async def test_a_version_newer_than_the_tombstone_is_served(late):
    """The tombstone hides only the version this client deleted: a later version (another
    client wrote it after the delete) is newer and is served and cached."""
    await put(late, "/b/x")
    cache = CachedMetadataStore(late)
    first = lookup(cache, "/b/x", True)  # keeps the path in flight, answers version 1
    await late.asked.wait()
    await cache.delete("/b/x")
    late.asked.clear()
    again = await put(late, "/b/x", seed=7)  # version 2, after our delete
    second = lookup(cache, "/b/x", False)  # reads version 2
    await late.asked.wait()
    late.release.set()
    assert await first is None and await second == again and again.version == 2
    assert cache.peek("/b/x") == again and no_record_left(cache)


async def test_commits_answered_out_of_order_keep_the_newest_cached(tmp_path):
    """Two commits of one path in flight: the older one's answer arrives last and is
    returned to its caller, but never replaces the newer plan in the cache."""

    class LateFirstCommit(SqliteMetadataStore):
        first = True
        committed = asyncio.Event()  # the first commit is in the store ...
        release = asyncio.Event()  # ... and its answer arrives when this is set

        async def commit(self, path, plan, if_version=None):
            answer = await super().commit(path, plan, if_version)
            if self.first:
                self.first = False
                self.committed.set()
                await self.release.wait()
            return answer

    async with LateFirstCommit(tmp_path / "m.sqlite") as store:
        cache = CachedMetadataStore(store)
        older = asyncio.ensure_future(cache.commit("/b/x", make_plan("/b/x", seed=1)))
        await store.committed.wait()
        newer = await cache.commit("/b/x", make_plan("/b/x", seed=2))
        store.release.set()
        assert (await older).version == 1 and newer.version == 2
        assert cache.peek("/b/x") == newer and no_record_left(cache)


# --- the TTL + LRU map, on a fake clock ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_cached_plan_is_served_until_its_ttl_and_not_after(tmp_path):
    clock = Clock()
    async with SqliteMetadataStore(tmp_path / "m.sqlite") as store:
        cache = CachedMetadataStore(store, ttl_seconds=10, clock=clock)
        committed = await cache.commit("/b/x", make_plan("/b/x"))
        clock.now += 9.99
        assert cache.peek("/b/x") == committed
        clock.now += 0.01
        assert cache.peek("/b/x") is None and cache.stats()["entries"] == 0  # a stale plan is dropped
        assert await cache.get_plan("/b/x") == committed and cache.stats()["misses"] == 1


async def test_a_full_cache_drops_the_least_recently_used_plan(tmp_path):
    clock = Clock()
    async with SqliteMetadataStore(tmp_path / "m.sqlite") as store:
        cache = CachedMetadataStore(store, max_entries=2, clock=clock)
        a, b = [await cache.commit(p, make_plan(p)) for p in ("/b/a", "/b/b")]
        assert cache.peek("/b/a") == a  # a is now used more recently than b
        await cache.commit("/b/c", make_plan("/b/c"))
        assert cache.peek("/b/b") is None and cache.peek("/b/a") == a and cache.stats()["entries"] == 2
        assert b.version == 1


async def test_a_plan_whose_grants_expire_is_dropped_a_margin_before(tmp_path, monkeypatch):
    """Grants expire by the wall clock: the cache keeps the plan until GRANT_MARGIN_S before."""
    clock = Clock()
    monkeypatch.setattr(auth.time, "time", lambda: 5000.0)
    async with SqliteMetadataStore(tmp_path / "m.sqlite") as store:
        cache = CachedMetadataStore(store, ttl_seconds=3600, clock=clock)
        plan = msgspec.structs.replace(make_plan("/b/x"), grants_expire=5000 + auth.GRANT_MARGIN_S + 30)
        cache._remember(msgspec.structs.replace(plan, version=1), "/b/x")
        clock.now += 29.9
        assert cache.peek("/b/x") is not None
        clock.now += 0.1
        assert cache.peek("/b/x") is None
        soon = msgspec.structs.replace(plan, version=2, grants_expire=5000 + auth.GRANT_MARGIN_S)
        cache._remember(soon, "/b/x")
        assert cache.peek("/b/x") is None  # usable for 0 s: never cached
