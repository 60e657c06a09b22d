"""The ChunkCache conformance suite: what every cache engine holds (blobsdk/cache/base.py and
policy.py), for blobsdk's own engines and for one you write.

Subclass :class:`ChunkCacheTests` in a ``test_*.py`` module (a class named ``Test...``, so
pytest collects it; the suite's own name does not start with ``Test``, so it is never
collected alone) and provide a fixture ``make_cache``: an async factory
``await make_cache(capacity_bytes, **options)`` returning an open, empty cache (options:
``ttl_seconds``, ``hold_seconds``, ``quotas``, ``clock``, a callable of monotonic seconds)
that the fixture closes afterwards.  The suite needs pytest and pytest-asyncio (the
``testing`` extra); its tests carry the asyncio mark, so they run in pytest-asyncio's strict
mode as in its auto mode.  :func:`key`, :func:`blob`, :func:`fill`, :func:`present` and
:class:`FakeClock` are for a backend's own tests too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._extras import requires_extra
from ..cache import ChunkCache
from ..errors import BadRequest, QuotaExceeded

with requires_extra("testing", "blobsdk.testing"):
    import pytest
    import pytest_asyncio

HOSTILE_KEYS = [
    "",
    "../../etc/passwd",
    "A" * 32,
    "a" * 31,
    "a" * 33,
    "g" * 32,
    "0" * 30 + "/x",
    "0" * 31 + "\x00",
    " " + "0" * 31,
    "0" * 32 + "\n",
    "..",
    None,
    123,
    b"0" * 32,
]


def key(n: int) -> str:
    """A valid chunk key, distinct per ``n``."""
    return f"{n:032x}"


def blob(n: int, size: int = 100) -> bytes:
    """``size`` bytes whose content depends on ``n``."""
    return bytes((n + i) % 251 for i in range(size))


class FakeClock:
    """An injectable monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def fill(cache: ChunkCache, *ns: int, size: int = 100, **kw: Any) -> None:
    for n in ns:
        assert await cache.put(key(n), blob(n, size), **kw)


async def present(cache: ChunkCache, *ns: int) -> list[bool]:
    return [cache.contains(key(n)) for n in ns]


class ChunkCacheTests:
    """Every ChunkCache engine passes these.  Fixture ``make_cache``: see the module docstring."""

    pytestmark = pytest.mark.asyncio

    @pytest_asyncio.fixture
    async def cache(self, make_cache: Any) -> ChunkCache:
        cache: ChunkCache = await make_cache(1 << 20)
        return cache

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    # --- basics ---------------------------------------------------------------------------

    async def test_is_a_chunk_cache(self, cache: Any) -> None:
        assert isinstance(cache, ChunkCache)
        assert cache.capacity_bytes == 1 << 20 and cache.used_bytes == 0

    async def test_put_get_round_trip(self, cache: Any) -> None:
        assert await cache.put(key(1), blob(1, 5000))
        assert bytes(await cache.get(key(1))) == blob(1, 5000)
        assert cache.contains(key(1)) and cache.used_bytes == 5000

    @pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
    async def test_accepts_any_buffer(self, cache: Any, kind: Any) -> None:
        assert await cache.put(key(2), kind(blob(2)))
        assert bytes(await cache.get(key(2))) == blob(2)

    async def test_empty_value_is_a_hit_not_a_miss(self, cache: Any) -> None:
        assert await cache.put(key(3), b"")
        got = await cache.get(key(3))
        assert got is not None and bytes(got) == b""

    async def test_miss_returns_none(self, cache: Any) -> None:
        assert await cache.get(key(9)) is None
        assert not cache.contains(key(9))
        assert cache.stats()["misses"] == 1

    async def test_put_replaces(self, cache: Any) -> None:
        await cache.put(key(1), blob(1, 300))
        await cache.put(key(1), blob(7, 200))
        assert bytes(await cache.get(key(1))) == blob(7, 200)
        assert cache.used_bytes == 200 and cache.stats()["entries"] == 1

    async def test_delete_is_idempotent(self, cache: Any) -> None:
        await fill(cache, 1)
        assert await cache.delete(key(1)) is True
        assert await cache.delete(key(1)) is False
        assert await cache.get(key(1)) is None
        assert cache.used_bytes == 0

    @pytest.mark.parametrize("bad", HOSTILE_KEYS, ids=repr)
    async def test_invalid_keys_are_bad_requests(self, cache: Any, bad: Any) -> None:
        with pytest.raises(BadRequest):
            await cache.get(bad)
        with pytest.raises(BadRequest):
            await cache.put(bad, b"x")
        with pytest.raises(BadRequest):
            await cache.delete(bad)
        with pytest.raises(BadRequest):
            cache.contains(bad)
        assert cache.stats()["entries"] == 0

    @pytest.mark.parametrize("bad", ["", "x" * 256, None, 7])
    async def test_invalid_tenant_is_a_bad_request(self, cache: Any, bad: Any) -> None:
        with pytest.raises(BadRequest):
            await cache.put(key(1), b"x", tenant=bad)

    async def test_stats_counters(self, cache: Any) -> None:
        await fill(cache, 1, 2)
        await cache.get(key(1))
        await cache.get(key(5))
        s = cache.stats()
        want = {"hits": 1, "misses": 1, "puts": 2, "evictions": 0, "corrupt": 0, "bytes": 200, "entries": 2}
        assert {k: s[k] for k in want} == want
        assert s["capacity_bytes"] == 1 << 20

    async def test_tenant_usage(self, cache: Any) -> None:
        await fill(cache, 1, 2, tenant="a")
        await fill(cache, 3, tenant="b")
        assert cache.tenant_usage() == {"a": 200, "b": 100}
        await cache.delete(key(3))
        assert cache.tenant_usage() == {"a": 200}

    # --- capacity and LRU -----------------------------------------------------------------

    async def test_evicts_least_recently_used(self, make_cache: Any) -> None:
        cache = await make_cache(300)
        await fill(cache, 0, 1, 2)
        assert await cache.get(key(0)) is not None  # 1 is now the least recently used
        await fill(cache, 3)
        assert await present(cache, 0, 1, 2, 3) == [True, False, True, True]
        s = cache.stats()
        assert s["evictions"] == 1 and s["lru_evictions"] == 1 and s["lru_evicted_bytes"] == 100
        assert cache.used_bytes == 300

    async def test_contains_does_not_touch_lru(self, make_cache: Any) -> None:
        cache = await make_cache(200)
        await fill(cache, 0, 1)
        assert cache.contains(key(0))
        await fill(cache, 2)
        assert await present(cache, 0, 1, 2) == [False, True, True]

    async def test_big_put_evicts_several(self, make_cache: Any) -> None:
        cache = await make_cache(300)
        await fill(cache, 0, 1, 2)
        await fill(cache, 3, size=250)
        assert await present(cache, 0, 1, 2, 3) == [False, False, False, True]
        assert cache.used_bytes == 250

    async def test_entry_larger_than_capacity_is_refused(self, make_cache: Any) -> None:
        cache = await make_cache(150)
        await fill(cache, 0)
        assert await cache.put(key(1), blob(1, 151)) is False
        assert await cache.get(key(1)) is None
        assert bytes(await cache.get(key(0))) == blob(0)  # the rest still works
        assert cache.stats()["rejected"] == 1

    async def test_zero_capacity_stores_nothing(self, make_cache: Any) -> None:
        cache = await make_cache(0)
        assert await cache.put(key(1), b"x") is False
        assert await cache.get(key(1)) is None

    async def test_failed_put_drops_the_older_value(self, make_cache: Any) -> None:
        cache = await make_cache(150)
        await fill(cache, 0)
        assert await cache.put(key(0), blob(5, 200)) is False
        assert await cache.get(key(0)) is None  # never the bytes of an earlier put

    async def test_concurrent_puts_and_gets_never_return_wrong_bytes(self, make_cache: Any) -> None:
        cache = await make_cache(1000)

        async def worker(n: int) -> None:
            for i in range(20):
                k = (n * 7 + i) % 15
                if i % 3:
                    await cache.put(key(k), blob(k, 200))
                got = await cache.get(key(k))
                assert got is None or bytes(got) == blob(k, 200)
                assert cache.used_bytes <= 1000

        await asyncio.gather(*(worker(n) for n in range(6)))
        assert cache.used_bytes <= 1000

    # --- TTL ------------------------------------------------------------------------------

    async def test_ttl_expiry(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(1000, ttl_seconds=10, clock=clock)
        await fill(cache, 1)
        clock.advance(9.9)
        assert await cache.get(key(1)) is not None  # a read does not extend the TTL
        clock.advance(0.1)
        assert await cache.get(key(1)) is None
        assert not cache.contains(key(1)) and cache.used_bytes == 0
        assert cache.stats()["ttl_evictions"] == 1

    async def test_expired_entries_are_evicted_before_lru(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(300, ttl_seconds=10, clock=clock)
        await fill(cache, 0)
        clock.advance(5)
        await fill(cache, 1, 2)
        clock.advance(4)
        await cache.get(key(0))  # 0 is the most recently used, 1 the least
        clock.advance(2)  # 0 has expired, 1 and 2 have not
        await fill(cache, 3)
        assert await present(cache, 0, 1, 2, 3) == [False, True, True, True]
        assert cache.stats()["ttl_evictions"] == 1 and cache.stats()["lru_evictions"] == 0

    # --- hold period ----------------------------------------------------------------------

    async def test_hold_protects_young_data_while_older_data_exists(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(300, hold_seconds=10, clock=clock)
        await fill(cache, 0)
        clock.advance(11)  # 0 is past its hold period
        await fill(cache, 1, 2)
        await cache.get(key(0))  # 1 is now the least recently used, but held
        await fill(cache, 3)
        assert await present(cache, 0, 1, 2, 3) == [False, True, True, True]

    async def test_hold_gives_way_rather_than_overflow(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(300, hold_seconds=10, clock=clock)
        await fill(cache, 0, 1, 2)
        await cache.get(key(0))
        await fill(cache, 3)  # everything is held: evict the least recently used held entry
        assert await present(cache, 0, 1, 2, 3) == [True, False, True, True]
        assert cache.stats()["hold_evictions"] == 1 and cache.used_bytes == 300

    # --- pins -----------------------------------------------------------------------------

    async def test_pinned_entries_are_skipped(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(300, clock=clock)
        await fill(cache, 0, pin_seconds=60)
        await fill(cache, 1, 2)
        await fill(cache, 3)
        assert await present(cache, 0, 1, 2, 3) == [True, False, True, True]

    async def test_put_that_needs_pinned_space_fails_and_evicts_nothing(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(300, clock=clock)
        await fill(cache, 0, 1, pin_seconds=60)
        await fill(cache, 2)
        assert await cache.put(key(3), blob(3, 250)) is False
        assert await present(cache, 0, 1, 2, 3) == [True, True, True, False]
        assert cache.stats()["evictions"] == 0

    async def test_pin_expires(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(200, clock=clock)
        await fill(cache, 0, pin_seconds=10)
        await fill(cache, 1)
        await cache.get(key(1))
        clock.advance(10)
        await fill(cache, 2)
        assert await present(cache, 0, 1, 2) == [False, True, True]

    async def test_pin_method_extends_a_pin(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(200, clock=clock)
        await fill(cache, 0, 1)
        assert cache.pin(key(0), 30) is True
        assert cache.pin(key(7), 30) is False
        await fill(cache, 2)
        assert await present(cache, 0, 1, 2) == [True, False, True]

    async def test_pin_outlives_ttl(self, make_cache: Any, clock: Any) -> None:
        cache = await make_cache(1000, ttl_seconds=5, clock=clock)
        await fill(cache, 0, pin_seconds=20)
        clock.advance(10)
        assert bytes(await cache.get(key(0))) == blob(0)
        clock.advance(10)
        assert await cache.get(key(0)) is None

    # --- quotas ---------------------------------------------------------------------------

    async def test_over_quota_tenant_loses_its_own_lru_data_first(self, make_cache: Any) -> None:
        cache = await make_cache(1000, quotas={"t1": 250})
        await fill(cache, 0, tenant="t2")  # the globally least recently used entry
        await fill(cache, 1, 2, tenant="t1")
        await cache.get(key(1))
        await fill(cache, 3, tenant="t1")  # t1 would hold 300 > 250: its LRU entry (2) goes
        assert await present(cache, 0, 1, 2, 3) == [True, True, False, True]
        assert cache.tenant_usage() == {"t1": 200, "t2": 100}
        assert cache.stats()["quota_evictions"] == 1

    async def test_quota_exceeded_only_for_the_over_quota_tenant(self, make_cache: Any) -> None:
        cache = await make_cache(1000, quotas={"t1": 250})
        await fill(cache, 1, tenant="t1")
        with pytest.raises(QuotaExceeded) as exc:
            await cache.put(key(2), blob(2, 300), tenant="t1")
        message = str(exc.value)
        assert "t1" in message and "250" in message and "100" in message
        assert cache.contains(key(1))  # nothing was evicted for a put that failed
        await fill(cache, 3, 4, 5, size=200, tenant="t2")  # other tenants are unaffected
        assert cache.stats()["quota_exceeded"] == 1

    async def test_a_put_refused_for_its_quota_changes_nothing(self, make_cache: Any) -> None:
        """Another tenant's copy of the key stays, as do the refused tenant's own entries."""
        cache = await make_cache(1000, quotas={"t1": 250})
        await fill(cache, 0, tenant="t2")
        await fill(cache, 1, 2, tenant="t1", pin_seconds=60)
        with pytest.raises(QuotaExceeded):
            await cache.put(key(0), blob(0, 100), tenant="t1")
        assert await present(cache, 0, 1, 2) == [True, True, True]
        assert bytes(await cache.get(key(0))) == blob(0)
        assert cache.tenant_usage() == {"t1": 200, "t2": 100}

    async def test_a_tenant_at_its_quota_replaces_its_own_entry(self, make_cache: Any) -> None:
        cache = await make_cache(1000, quotas={"t1": 250})
        await fill(cache, 0, tenant="t1", pin_seconds=60)
        await fill(cache, 1, tenant="t1", pin_seconds=60)
        assert await cache.put(key(0), blob(7, 150), tenant="t1")  # its own 100 bytes make way
        assert bytes(await cache.get(key(0))) == blob(7, 150)
        assert cache.tenant_usage() == {"t1": 250}

    async def test_pinned_data_counts_against_the_quota(self, make_cache: Any) -> None:
        cache = await make_cache(1000, quotas={"t1": 250})
        await fill(cache, 1, 2, tenant="t1", pin_seconds=60)
        with pytest.raises(QuotaExceeded):
            await cache.put(key(3), blob(3), tenant="t1")
        assert await present(cache, 1, 2, 3) == [True, True, False]

    async def test_tenants_within_their_quotas_share_capacity_by_lru(self, make_cache: Any) -> None:
        cache = await make_cache(400, quotas={"t1": 200, "t2": 1000})
        await fill(cache, 0, tenant="t2")
        await fill(cache, 1, 2, tenant="t1")
        await fill(cache, 3, tenant="t2")
        await fill(cache, 4, tenant="t2")  # full, nobody over quota: the global LRU entry goes
        assert await present(cache, 0, 1, 2, 3, 4) == [False, True, True, True, True]
