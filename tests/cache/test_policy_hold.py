"""Eviction with a hold period (blobsdk/cache/policy.py, blobsdk/cache/_index.py): the index
keeps the held entries in creation order and the released ones in a heap by last access, so
a put into a cache full of held entries does not walk them all looking for one past its
hold, in either engine (the L1 and the L2 / L3 disk cache)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest

from blobsdk.cache import DiskCache, MemoryCache
from blobsdk.cache.policy import Entry, HoldPolicy, Index
from blobsdk.testing.cache import FakeClock, key

from .walked import Walked

HOLD = 60.0


def _count_walks(cache: MemoryCache | DiskCache) -> None:
    """From now on, count the entries any eviction walks in the orders of the index."""
    index = cache._index if isinstance(cache, MemoryCache) else cache._ledger.index
    index.lru = Walked(index.lru)
    if index.by_age is not None:
        index.by_age = Walked(index.by_age)
    if getattr(index, "held", None) is not None:  # (getattr: the test runs on an index without one too)
        index.held = Walked(index.held)
    if isinstance(cache, MemoryCache):
        cache._lookup = index.lru.get
    Walked.walked = 0


async def _engine(kind: str, tmp_path: Path, capacity: int, clock: FakeClock) -> MemoryCache | DiskCache:
    if kind == "memory":
        return MemoryCache(capacity, hold_seconds=HOLD, clock=clock)
    cache = DiskCache(tmp_path, capacity_bytes=capacity, hold_seconds=HOLD, min_free_ratio=0, clock=clock)
    return await cache.open()


@pytest.mark.parametrize("kind", ["memory", "disk"])
async def test_a_put_into_a_cache_full_of_held_entries_evicts_in_constant_steps(kind: str, tmp_path: Path) -> None:
    size, puts, clock = 1000, 100, FakeClock()
    cache = await _engine(kind, tmp_path, size, clock)
    for n in range(size):
        assert await cache.put(key(n), b"x")
        clock.advance(0.001)  # all well inside their hold period
    _count_walks(cache)
    for n in range(size, size + puts):  # each evicts the least recently used held entry
        assert await cache.put(key(n), b"x")
        assert not cache.contains(key(n - size))
    assert cache.stats()["hold_evictions"] == puts and cache.stats()["lru_evictions"] == 0
    assert Walked.walked <= 5 * puts  # 4 a put (400); before: each put walked all 1,000 held entries (100,300)
    await cache.aclose()


@pytest.mark.parametrize("kind", ["memory", "disk"])
async def test_entries_past_their_hold_go_first_in_lru_order_though_held_ones_were_used_less_recently(
    kind: str, tmp_path: Path
) -> None:
    size, clock = 1000, FakeClock()
    cache = await _engine(kind, tmp_path, size + 3, clock)
    for n in range(3):  # 0, 1, 2: past their hold by the time the cache is full
        assert await cache.put(key(n), b"x")
    clock.advance(HOLD + 1)
    for n in range(3, size + 3):
        assert await cache.put(key(n), b"x")
    for n in (2, 0, 1):  # now the most recently used, behind the 1,000 held entries
        clock.advance(0.001)
        assert await cache.get(key(n)) == b"x"
    _count_walks(cache)
    for n, gone in ((size + 3, 2), (size + 4, 0), (size + 5, 1), (size + 6, 3)):
        assert await cache.put(key(n), b"x")
        assert not cache.contains(key(gone)), f"{gone} is the one to evict"
    assert cache.stats()["lru_evictions"] == 3 and cache.stats()["hold_evictions"] == 1
    assert Walked.walked <= 40  # 10; before: the first three puts walked 1,000 held entries each (4,016)
    await cache.aclose()


@pytest.mark.parametrize("kind", ["memory", "disk"])
async def test_a_cache_half_held_half_released_evicts_the_released_without_walking_the_held(kind: str, tmp_path: Path) -> None:
    """Released entries used after the held ones were put: the LRU order walked from its old
    end meets every held entry before the first released one."""
    half, puts, clock = 500, 100, FakeClock()
    cache = await _engine(kind, tmp_path, 2 * half, clock)
    for n in range(half):
        assert await cache.put(key(n), b"x")
    clock.advance(HOLD + 1)
    for n in range(half, 2 * half):
        assert await cache.put(key(n), b"x")
    for n in range(half):
        clock.advance(0.001)
        assert await cache.get(key(n)) == b"x"
    _count_walks(cache)
    for n in range(puts):
        assert await cache.put(key(2 * half + n), b"x")
        assert not cache.contains(key(n)), f"{n} is the least recently used past its hold"
    assert cache.stats()["lru_evictions"] == puts and cache.stats()["hold_evictions"] == 0
    assert Walked.walked <= 5 * puts  # 2 a put (200); before: each put walked the 500 held entries (50,300)
    await cache.aclose()


def test_a_hold_period_needs_an_index_that_keeps_its_held_entries() -> None:
    index = Index()
    index.add(Entry(key(1), 1, 0.0, 0.0))
    wanted = r"^a hold period needs an index that keeps its held entries \(Index\(hold=True\)\)$"
    with pytest.raises(ValueError, match=wanted):
        list(HoldPolicy(HOLD).released(index, 1.0))


def test_released_entries_come_by_last_access_and_a_pinned_one_never() -> None:
    index = Index(hold=True)
    for n, created in enumerate((0.0, 0.0, 0.0, 90.0)):  # 0, 1, 2 past a hold of 60 at 100
        index.add(Entry(key(n), 1, created, created))
    index.touch(index.lru[key(0)], 50.0)  # last access: 1 and 2 at 0, 0 at 50
    hold = HoldPolicy(HOLD)
    assert [e.key for e in hold.released(index, 100.0)] == [key(1), key(2), key(0)]
    index.lru[key(1)].pin_until = 200.0
    index.touch(index.lru[key(2)], 80.0)  # used since its record was written: later now
    assert [e.key for e in hold.released(index, 100.0)] == [key(0), key(2)]
    index.remove(key(0))
    assert [e.key for e in hold.released(index, 100.0)] == [key(2)]
    # at 300, 1's pin is over (it counts as used when its pin ended, at 200) and 3 is released
    assert [e.key for e in hold.released(index, 300.0)] == [key(2), key(3), key(1)]


class _Looked(OrderedDict[str, Entry]):
    """An LRU order that counts the lookups of its entries."""

    looked = 0

    def get(self, key: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        _Looked.looked += 1
        return super().get(key, default)


def test_walks_do_not_pass_released_entries_again_while_they_are_pinned() -> None:
    index, hold = Index(hold=True), HoldPolicy(HOLD)
    for n in range(1000):
        index.add(Entry(key(n), 1, 0.0, 0.0, pin_until=500.0))
    index.lru = _Looked(index.lru)
    assert list(hold.released(index, 100.0)) == []  # each is met once, and set aside until 500
    _Looked.looked = 0
    for now in range(101, 201):
        assert list(hold.released(index, float(now))) == []
    assert _Looked.looked <= 1000  # the 1,000 put back once, then nothing: not 1,000 a walk
    assert [e.key for e in hold.released(index, 500.0)][:2] == [key(0), key(1)]


async def test_a_restart_from_the_index_file_releases_an_entry_past_its_hold_behind_a_younger_one(tmp_path: Path) -> None:
    """The index file lists entries by last access; the load puts the held ones back in
    creation order.  Here 1 (made at 0, used at 70) is past its hold at the restart and 2
    (made at 30, used then) is not: in last-access order 2 would stand first, 1 would never be
    released, and the next put would evict 2, still held, instead of 1."""
    clock = FakeClock(0.0)
    async with DiskCache(tmp_path, capacity_bytes=200, hold_seconds=HOLD, min_free_ratio=0, clock=clock) as cache:
        assert await cache.put(key(1), b"1" * 100)
        clock.advance(30)
        assert await cache.put(key(2), b"2" * 100)
        clock.advance(40)
        assert await cache.get(key(1)) == b"1" * 100  # 2 is now the least recently used
    async with DiskCache(tmp_path, capacity_bytes=200, hold_seconds=HOLD, min_free_ratio=0, clock=clock) as cache:
        index = cache._ledger.index
        assert list(index.lru) == [key(2), key(1)] and list(index.held or {}) == [key(2)]
        assert await cache.put(key(3), b"3" * 100)
        assert [cache.contains(key(n)) for n in (1, 2, 3)] == [False, True, True]
        assert cache.stats()["lru_evictions"] == 1 and cache.stats()["hold_evictions"] == 0
