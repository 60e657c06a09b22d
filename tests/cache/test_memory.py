from __future__ import annotations

import pytest

from blobsdk.cache.memory import MemoryCache
from blobsdk.errors import BadRequest
from blobsdk.testing.cache import ChunkCacheTests, FakeClock, blob, key


class TestMemoryCache(ChunkCacheTests):
    @pytest.fixture
    async def make_cache(self):
        made: list[MemoryCache] = []

        async def make(capacity_bytes: int, **options) -> MemoryCache:
            made.append(MemoryCache(capacity_bytes, **options))
            return made[-1]

        yield make
        for cache in made:
            await cache.aclose()


def test_get_nowait_returns_the_stored_bytes_object():
    cache = MemoryCache(1000)
    data = blob(1)
    assert cache.put_nowait(key(1), data)
    assert cache.get_nowait(key(1)) is data
    assert cache.get_nowait(key(1)) is data


def test_buffers_are_stored_as_read_only_views_without_a_copy():
    cache = MemoryCache(1000)
    data = bytearray(blob(1))
    cache.put_nowait(key(1), data)
    got = cache.get_nowait(key(1))
    assert isinstance(got, memoryview) and got.readonly and got.obj is data
    with pytest.raises(TypeError):
        got[0] = 1


def test_multi_byte_buffers_are_counted_in_bytes():
    cache = MemoryCache(1000)
    words = memoryview(bytearray(400)).cast("I")  # 100 items of 4 bytes
    cache.put_nowait(key(1), words)
    assert cache.used_bytes == 400 and len(cache.get_nowait(key(1))) == 400


def test_invalid_key_is_rejected_on_the_sync_path():
    cache = MemoryCache(1000)
    for bad in ("../../etc/passwd", "A" * 32, "", ["not", "hashable"]):
        with pytest.raises(BadRequest):
            cache.get_nowait(bad)


def test_expired_entry_is_a_miss_on_the_sync_path():
    clock = FakeClock()
    cache = MemoryCache(1000, ttl_seconds=1, clock=clock)
    cache.put_nowait(key(1), blob(1))
    clock.advance(1)
    assert cache.get_nowait(key(1)) is None
    assert cache.stats()["misses"] == 1 and cache.used_bytes == 0


async def test_aclose_drops_everything():
    async with MemoryCache(1000) as cache:
        cache.put_nowait(key(1), blob(1))
    assert cache.used_bytes == 0 and cache.get_nowait(key(1)) is None
