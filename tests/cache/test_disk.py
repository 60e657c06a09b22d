from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from blobsdk.cache import DiskCache
from blobsdk.errors import BadRequest, ClientClosed, Unavailable
from blobsdk.testing.cache import (
    HOSTILE_KEYS,
    ChunkCacheTests,
    FakeClock,
    blob,
    fill,
    key,
    present,
)
from tests.helpers import stored_files


class TestDiskCache(ChunkCacheTests):
    @pytest.fixture
    async def make_cache(self, tmp_path):
        made: list[DiskCache] = []

        async def make(capacity_bytes: int, **options) -> DiskCache:
            # min_free_ratio=0: the suite must not depend on how full the test disk is
            cache = DiskCache(tmp_path / f"c{len(made)}", capacity_bytes=capacity_bytes, min_free_ratio=0, **options)
            made.append(cache)
            return await cache.open()

        yield make
        for cache in made:
            await cache.aclose()


def chunk_file(root: Path, n: int) -> Path:
    return root / key(n)[:2] / key(n)


def open_cache(root: Path, capacity: int = 1 << 20, **kw) -> DiskCache:
    kw.setdefault("min_free_ratio", 0)
    return DiskCache(root, capacity_bytes=capacity, **kw)


def without_index(root: Path) -> None:
    """Remove the index file: the next open reads every header (as after a crash before any
    index file was written)."""
    (root / "INDEX").unlink()


def set_times(path: Path, *, atime_ago: float, mtime_ago: float) -> None:
    now = time.time()
    os.utime(path, (now - atime_ago, now - mtime_ago))


# --- layout and restart --------------------------------------------------------------------


async def test_one_file_per_entry_under_its_shard(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
        got = await cache.get(key(1))
    assert type(got) is bytearray  # the caller owns it: the read path may hand it on without a copy
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("FORMAT", "INDEX")]
    assert files == [chunk_file(tmp_path, 1)] and (tmp_path / "INDEX").is_file()  # INDEX: written at close
    assert files[0].stat().st_size > 100  # the header travels with the payload


async def test_restart_rebuilds_the_index(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2, tenant="a")
        await fill(cache, 3, size=300, tenant="b")
        await cache.delete(key(2))
    async with open_cache(tmp_path) as cache:
        assert bytes(await cache.get(key(1))) == blob(1)
        assert bytes(await cache.get(key(3))) == blob(3, 300)
        assert await present(cache, 1, 2, 3) == [True, False, True]
        assert cache.tenant_usage() == {"a": 100, "b": 300}
        assert cache.used_bytes == 400 and cache.stats()["corrupt"] == 0


async def test_restart_seeds_lru_from_access_times(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 0, 1, 2)
    for n, ago in ((0, 10), (1, 300), (2, 100)):
        set_times(chunk_file(tmp_path, n), atime_ago=ago, mtime_ago=400)
    without_index(tmp_path)  # the restart reads the headers: the file times are what it sees
    async with open_cache(tmp_path, capacity=300) as cache:
        await fill(cache, 3)
        assert await present(cache, 0, 1, 2, 3) == [True, False, True, True]


async def test_ttl_and_hold_survive_restart_through_mtime(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 0, 1)
    set_times(chunk_file(tmp_path, 0), atime_ago=3600, mtime_ago=3600)
    without_index(tmp_path)  # the restart reads the headers: the file times are what it sees
    async with open_cache(tmp_path, ttl_seconds=60, hold_seconds=30) as cache:
        assert await cache.get(key(0)) is None  # expired an hour ago
        assert bytes(await cache.get(key(1))) == blob(1)
    assert not chunk_file(tmp_path, 0).exists()


async def test_reads_refresh_stale_access_times(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 0)
        set_times(chunk_file(tmp_path, 0), atime_ago=3600, mtime_ago=3600)
        await cache.get(key(0))
    st = chunk_file(tmp_path, 0).stat()
    assert time.time() - st.st_atime < 60 and time.time() - st.st_mtime > 3000


async def test_open_trims_to_a_smaller_capacity(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 0, 1, 2)
    for n, ago in ((0, 10), (1, 300), (2, 100)):
        set_times(chunk_file(tmp_path, n), atime_ago=ago, mtime_ago=400)
    without_index(tmp_path)  # the restart reads the headers: the file times are what it sees
    async with open_cache(tmp_path, capacity=150) as cache:
        assert await present(cache, 0, 1, 2) == [True, False, False]
        assert cache.used_bytes == 100 and cache.stats()["lru_evictions"] == 2
    assert not chunk_file(tmp_path, 1).exists() and not chunk_file(tmp_path, 2).exists()


async def test_over_quota_tenant_after_restart_is_evicted_first(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 0, tenant="b")
        await fill(cache, 1, 2, tenant="a")
    async with open_cache(tmp_path, capacity=300, quotas={"a": 100}) as cache:
        await fill(cache, 3, tenant="b")  # full: tenant a is over its quota and goes first
        assert await present(cache, 0, 1, 2, 3) == [True, False, True, True]


# --- damage ------------------------------------------------------------------------------


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("offset", [-1, -100, 40])  # payload end, payload middle, payload start
async def test_flipped_payload_byte_is_a_counted_miss(tmp_path, offset):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2)
        flip_byte(chunk_file(tmp_path, 1), offset)
        assert await cache.get(key(1)) is None
        assert cache.stats()["corrupt"] == 1 and not cache.contains(key(1))
        assert not chunk_file(tmp_path, 1).exists()
        assert bytes(await cache.get(key(2))) == blob(2)
        assert cache.used_bytes == 100


async def test_truncated_file_is_a_counted_miss(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
        os.truncate(chunk_file(tmp_path, 1), 80)
        assert await cache.get(key(1)) is None
        assert cache.stats()["corrupt"] == 1 and not chunk_file(tmp_path, 1).exists()


@pytest.mark.parametrize("damage", ["truncate", "header", "tenant", "empty"])
async def test_damaged_files_are_dropped_at_start_up(tmp_path, damage):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2, tenant="t")
    path = chunk_file(tmp_path, 1)
    if damage == "truncate":
        os.truncate(path, path.stat().st_size - 1)
    elif damage == "empty":
        os.truncate(path, 0)
    else:
        flip_byte(path, 5 if damage == "header" else 32)  # 32: the tenant name
    without_index(tmp_path)  # the restart reads the headers (with the index file: at the first read)
    async with open_cache(tmp_path) as cache:
        assert cache.stats()["corrupt"] == 1
        assert await present(cache, 1, 2) == [False, True]
        assert cache.tenant_usage() == {"t": 100}
    assert not path.exists()


async def test_misnamed_file_is_never_served(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2)
        os.replace(chunk_file(tmp_path, 2), chunk_file(tmp_path, 1))  # right bytes, wrong key
        assert await cache.get(key(1)) is None
        assert cache.stats()["corrupt"] == 1


async def test_file_deleted_under_the_cache_is_a_plain_miss(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
        chunk_file(tmp_path, 1).unlink()
        assert await cache.get(key(1)) is None
        assert not cache.contains(key(1)) and cache.used_bytes == 0
        assert cache.stats()["corrupt"] == 0


# --- temp files and foreign files ------------------------------------------------------------


async def test_dead_writers_temp_files_are_swept_at_open(tmp_path):
    """Whatever their age: a temp file is a live writer's while its lock is held
    (tests/cache/test_disk_dirs.py shows it with real processes)."""
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
    shard = chunk_file(tmp_path, 1).parent
    dead = shard / f"{key(1)}.dead0000-0123abcd.tmp"
    live = shard / f"{key(2)}.live0000-0123abcd.tmp"
    foreign = shard / "README"
    for path in (dead, live, foreign):
        path.write_bytes(b"partial")
    set_times(live, atime_ago=3600, mtime_ago=3600)
    held = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # as its writer holds it
        async with open_cache(tmp_path) as cache:
            await cache.reconciled()  # the index file's start sweeps in the background
            assert cache.stats()["entries"] == 1
    finally:
        os.close(held)
    assert not dead.exists()
    assert live.exists() and foreign.exists()  # a live writer's; not ours to judge


# --- write failures --------------------------------------------------------------------------


# A fault replaces one file operation of one cache (blobsdk/cache/_diskfiles.py) on the object
# that every part of the cache holds: it runs on the cache's threads.


class FullDisk:
    """``cache``'s disk fails every write with ENOSPC once ``full`` is set."""

    def __init__(self, cache: DiskCache) -> None:
        self.full = False
        self._write = cache._files.write_parts
        cache._files.write_parts = self.write_parts  # type: ignore[method-assign]

    def write_parts(self, fd, parts):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._write(fd, parts)


async def test_enospc_makes_put_return_false(tmp_path):
    async with open_cache(tmp_path) as cache:
        disk = FullDisk(cache)
        await fill(cache, 1)
        disk.full = True
        assert await cache.put(key(2), blob(2)) is False
        assert await cache.put(key(1), blob(1)) is False  # a failed re-put leaves nothing stale
        s = cache.stats()
        assert s["errors"] == 2 and s["puts"] == 1 and cache.used_bytes == 0
        assert await present(cache, 1, 2) == [False, False]
        disk.full = False
        await fill(cache, 3)
        assert bytes(await cache.get(key(3))) == blob(3)
    assert not list(tmp_path.rglob("*.tmp"))
    assert not chunk_file(tmp_path, 1).exists()


async def test_min_free_ratio_refuses_puts_but_keeps_reads(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
    async with open_cache(tmp_path, min_free_ratio=0.9999) as cache:
        assert await cache.put(key(2), blob(2)) is False
        assert bytes(await cache.get(key(1))) == blob(1)  # nothing was evicted in vain
        assert cache.stats()["rejected"] == 1


async def test_default_min_free_ratio_allows_puts_on_a_roomy_disk(tmp_path):
    async with DiskCache(tmp_path, capacity_bytes=1000, min_free_ratio=1e-6) as cache:
        await fill(cache, 1)


# --- processes sharing a directory, races ----------------------------------------------------


async def test_two_caches_on_one_directory(tmp_path):
    async with open_cache(tmp_path) as a:
        await fill(a, 1, 2)
        async with open_cache(tmp_path) as b:
            await a.delete(key(1))
            assert await b.get(key(1)) is None and not b.contains(key(1))
            assert await a.put(key(2), blob(9, 300))  # replaced: b must see new bytes or none
            got = await b.get(key(2))
            assert got is None or got == blob(9, 300)
            await b.delete(key(2))
            assert await a.get(key(2)) is None


class GatedReads:
    """``cache``'s reads pause after opening the file until ``go`` is set."""

    def __init__(self, cache: DiskCache) -> None:
        self.opened = threading.Event()
        self.go = threading.Event()
        self._read = cache._files.read_file
        cache._files.read_file = self.read_file  # type: ignore[method-assign]

    def read_file(self, fd, key, expected):
        self.opened.set()
        self.go.wait(5)
        return self._read(fd, key, expected)


async def test_eviction_racing_a_read_cannot_hurt_it(tmp_path):
    async with open_cache(tmp_path, capacity=100) as cache:
        gate = GatedReads(cache)
        await fill(cache, 1)
        reader = asyncio.create_task(cache.get(key(1)))
        await asyncio.to_thread(gate.opened.wait, 5)
        await fill(cache, 2)  # evicts (unlinks) 1 while its read is in flight
        assert not chunk_file(tmp_path, 1).exists()
        gate.go.set()
        assert await reader == blob(1)


class GatedWrites:
    """``cache``'s writes pause until ``go`` is set."""

    def __init__(self, cache: DiskCache) -> None:
        self.writing = threading.Event()
        self.go = threading.Event()
        self._write = cache._files.write_parts
        cache._files.write_parts = self.write_parts  # type: ignore[method-assign]

    def write_parts(self, fd, parts):
        self.writing.set()
        self.go.wait(5)
        self._write(fd, parts)


async def test_fill_in_flight_is_invisible_and_unevictable(tmp_path):
    async with open_cache(tmp_path, capacity=200) as cache:
        gate = GatedWrites(cache)
        writer = asyncio.create_task(cache.put(key(1), blob(1)))
        await asyncio.to_thread(gate.writing.wait, 5)
        assert not cache.contains(key(1)) and await cache.get(key(1)) is None
        assert cache.used_bytes == 100  # concurrent puts see its bytes
        gate.go.set()
        assert await writer
        assert await cache.get(key(1)) == blob(1)


class HalfWrittenFills(GatedWrites):
    """``cache``'s fills pause with the header and half the payload written, until ``go`` is set."""

    def write_parts(self, fd, parts):
        header, payload = parts
        half = len(payload) // 2
        self._write(fd, [header, payload[:half]])
        self.writing.set()
        self.go.wait(5)
        self._write(fd, [payload[half:]])


async def test_a_half_done_fill_is_never_seen_by_another_cache(tmp_path):
    data = blob(1, 10_000)
    async with open_cache(tmp_path) as cache:
        gate = HalfWrittenFills(cache)
        writer = asyncio.create_task(cache.put(key(1), data))
        await asyncio.to_thread(gate.writing.wait, 5)
        try:
            async with open_cache(tmp_path) as other:  # another process starting now scans the directory
                assert await other.get(key(1)) is None and not other.contains(key(1))
                assert other.stats()["corrupt"] == 0  # it met no partial file under the final name
        finally:
            gate.go.set()
        assert await writer
        assert await cache.get(key(1)) == data
    async with open_cache(tmp_path) as later:
        assert await later.get(key(1)) == data


async def test_cancelled_put_still_settles_the_index(tmp_path):
    async with open_cache(tmp_path) as cache:
        gate = GatedWrites(cache)
        writer = asyncio.create_task(cache.put(key(1), blob(1)))
        await asyncio.to_thread(gate.writing.wait, 5)
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        gate.go.set()
        for _ in range(200):
            if cache.contains(key(1)):
                break
            await asyncio.sleep(0.005)
        assert await cache.get(key(1)) == blob(1)
        assert cache.stats()["puts"] == 1


async def test_delete_during_a_fill_leaves_no_file(tmp_path):
    async with open_cache(tmp_path) as cache:
        gate = GatedWrites(cache)
        writer = asyncio.create_task(cache.put(key(1), blob(1)))
        await asyncio.to_thread(gate.writing.wait, 5)
        await cache.delete(key(1))
        gate.go.set()
        await writer
    assert not chunk_file(tmp_path, 1).exists()


# --- safety and lifecycle ------------------------------------------------------------------


@pytest.mark.parametrize("bad", HOSTILE_KEYS, ids=repr)
async def test_hostile_keys_never_touch_the_file_system(tmp_path, bad):
    root = tmp_path / "root"
    async with open_cache(root) as cache:
        for call in (cache.get(bad), cache.put(bad, b"x"), cache.delete(bad)):
            with pytest.raises(BadRequest):
                await call
        with pytest.raises(BadRequest):
            cache.pin(bad, 10)
    assert sorted(tmp_path.rglob("*")) == [root, root / "FORMAT", root / "INDEX"]  # INDEX names nothing


async def test_use_outside_async_with_is_refused(tmp_path):
    cache = open_cache(tmp_path)
    with pytest.raises(ClientClosed):
        await cache.get(key(1))
    async with cache:
        await fill(cache, 1)
    with pytest.raises(ClientClosed):
        await cache.get(key(1))
    with pytest.raises(ClientClosed):
        await cache.put(key(2), b"x")
    await cache.aclose()  # idempotent


async def test_unusable_root_is_unavailable(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(Unavailable):
        async with open_cache(tmp_path / "file"):
            pass


async def test_fake_clock_drives_disk_ttl(tmp_path):
    clock = FakeClock()
    async with open_cache(tmp_path, ttl_seconds=5, clock=clock) as cache:
        await fill(cache, 1)
        clock.advance(5)
        assert await cache.get(key(1)) is None
    assert not chunk_file(tmp_path, 1).exists()


async def test_expected_checksum_mismatch_is_corrupt_and_deleted(tmp_path):
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
        assert await cache.get(key(1), checksum=12345) is None
        assert cache.stats()["corrupt"] == 1 and not cache.contains(key(1))
        assert stored_files(tmp_path) == []
