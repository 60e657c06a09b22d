from __future__ import annotations

import pytest

from blobsdk.cache import MemoryCache, _memory  # _memory: the engine's module, whose key check a test replaces
from blobsdk.chunks import ChunkKey
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


def test_a_fill_that_fits_without_quotas_asks_no_policy(monkeypatch):
    """The L1 tier's fill of a checked key: no key check and, when the entry fits and no
    tenant has a quota nor entries a hold period, no eviction plan (the chain would pick no victim); the counters and
    the LRU order are a put's."""
    cache = MemoryCache(3 * len(blob(1)))

    def refused(*args, **kwargs):
        raise AssertionError("asked the policies")

    monkeypatch.setattr(cache._chain, "admit", refused)
    monkeypatch.setattr(_memory, "validate_key", refused)
    assert cache.fill(ChunkKey(key(1)), blob(1)) and cache.fill(ChunkKey(key(2)), blob(2))
    assert cache.lookup(ChunkKey(key(1))) == blob(1) and cache.lookup(ChunkKey(key(3))) is None
    assert cache.holds(ChunkKey(key(2))) and not cache.holds(ChunkKey(key(3)))
    assert cache.stats()["puts"] == 2 and cache.stats()["hits"] == 1 and cache.stats()["misses"] == 1
    monkeypatch.undo()
    assert cache.put_nowait(key(3), blob(3)) and cache.put_nowait(key(4), blob(4))  # evicts key(2), the LRU one
    assert cache.get_nowait(key(2)) is None and cache.get_nowait(key(1)) == blob(1)
    assert cache.stats()["lru_evictions"] == 1 and cache.used_bytes == 3 * len(blob(1))
