"""The plan cache: a plan the store answers is checked before anyone reads through it."""

from __future__ import annotations

import pytest

from blobsdk import Client
from blobsdk.errors import CorruptData
from blobsdk.metadata.cache import CachedMetadataStore
from blobsdk.metadata.sqlite import SqliteMetadataStore

from .conformance import bad_plan, make_plan, put
from .unchecked import plant_plan

NO_CHUNKS = "metadata store returned an invalid plan: plan for '/b/x': chunks cover 0 bytes, size is 10"


class OtherPathStore:
    """Answers every lookup with the plan of another path, as a confused server might."""

    def __init__(self, store: SqliteMetadataStore) -> None:
        self.store = store

    async def get_plan(self, path: str):
        return await self.store.get_plan("/b/other")

    async def get_plans(self, paths):
        return [await self.get_plan(p) for p in paths]


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
    async with SqliteMetadataStore(tmp_path / "m.sqlite") as store:
        await put(store, "/b/other")
        cache = CachedMetadataStore(OtherPathStore(store))  # type: ignore[arg-type]
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
