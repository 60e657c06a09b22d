"""The disk cache's index file (blobsdk/cache/_indexfile.py): a restart loads it instead of
reading every header, then reconciles with the directory in the background; a bad index file
is never trusted."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from blobsdk.cache import DiskCache, _diskscan
from blobsdk.cache._indexfile import read_index
from blobsdk.cache.policy import Entry, Index, TtlPolicy
from blobsdk.testing.cache import FakeClock, blob, fill, key, present

from .test_disk import chunk_file, flip_byte, open_cache


def listed(root: Path) -> list[Entry]:
    """The entries of ``root``'s index file, as a restart on the clock 0 reads them."""
    listing = read_index(str(root), 0.0)
    return [] if listing is None else listing.entries


class NoHeaderReads:
    """Counts the headers a scan reads (``_diskscan.read_header``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        real = _diskscan.read_header

        def counted(fd: int, name: str):  # type: ignore[no-untyped-def]
            self.reads += 1
            return real(fd, name)

        monkeypatch.setattr(_diskscan, "read_header", counted)


async def test_a_restart_loads_the_index_file_and_reads_no_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2, 3, tenant="t")
    headers = NoHeaderReads(monkeypatch)
    async with open_cache(tmp_path) as cache:
        assert cache.stats()["entries"] == 3 and cache.tenant_usage() == {"t": 300}  # at once: from the file
        await cache.reconciled()
        assert [bytes(await cache.get(key(n)) or b"") for n in (1, 2, 3)] == [blob(1), blob(2), blob(3)]
    assert headers.reads == 0


async def test_the_lru_order_and_the_ages_survive_a_restart_through_the_index_file(tmp_path: Path) -> None:
    clock = FakeClock()
    async with open_cache(tmp_path, clock=clock) as cache:
        await fill(cache, 1, 2)
        clock.advance(10)
        await fill(cache, 0)
        await cache.get(key(2))  # 1 is now the least recently used
    async with open_cache(tmp_path, capacity=250, ttl_seconds=3600, clock=FakeClock()) as cache:
        assert await present(cache, 0, 1, 2) == [True, False, True]
        assert cache.stats()["lru_evictions"] == 1
    async with open_cache(tmp_path, ttl_seconds=5) as cache:  # 2 was filled 10 s before 0, by the first clock
        assert await cache.get(key(2)) is None and await cache.get(key(0)) == bytearray(blob(0))


async def test_the_background_reconciliation_sees_what_changed_in_the_directory(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "l2", tmp_path / "other"
    async with open_cache(root) as cache:
        await fill(cache, 1, 2)
    async with open_cache(elsewhere) as other:
        await fill(other, 3)
    chunk_file(root, 2).unlink()  # another process evicted it
    shutil.copy(chunk_file(elsewhere, 3), chunk_file(root, 3))  # and filled this one
    dead = chunk_file(root, 1).parent / f"{key(4)}.dead0000-0123abcd.tmp"
    dead.write_bytes(b"partial")  # a writer that died
    async with open_cache(root) as cache:
        assert await present(cache, 1, 2, 3) == [True, True, False]  # what the index file said
        await cache.reconciled()
        assert await present(cache, 1, 2, 3) == [True, False, True]
        assert bytes(await cache.get(key(3)) or b"") == blob(3) and cache.used_bytes == 200
    assert not dead.exists()
    assert [e.key for e in listed(root)] == [key(1), key(3)]  # written again once reconciled


async def test_a_root_that_is_a_symlink_restarts_from_its_index_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    async with open_cache(tmp_path / "link") as cache:
        await fill(cache, 1)
    headers = NoHeaderReads(monkeypatch)
    async with open_cache(tmp_path / "link") as cache:
        assert bytes(await cache.get(key(1)) or b"") == blob(1)
    assert headers.reads == 0 and (tmp_path / "real" / "INDEX").is_file()


async def test_an_entry_put_or_deleted_while_reconciling_is_kept_as_it_is(tmp_path: Path) -> None:
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2)
    async with open_cache(tmp_path) as cache:
        await fill(cache, 3)
        assert await cache.delete(key(1))
        await cache.reconciled()
        assert await present(cache, 1, 2, 3) == [False, True, True]


async def test_a_file_damaged_after_the_index_was_written_is_dropped_at_its_first_read(tmp_path: Path) -> None:
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2)
    flip_byte(chunk_file(tmp_path, 1), -1)
    async with open_cache(tmp_path) as cache:
        await cache.reconciled()
        assert cache.stats()["corrupt"] == 0  # not read yet: a known file's header is not read again
        assert await cache.get(key(1)) is None and bytes(await cache.get(key(2)) or b"") == blob(2)
        assert cache.stats()["corrupt"] == 1
    assert not chunk_file(tmp_path, 1).exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "version", "symlink"])
async def test_a_bad_index_file_is_ignored_and_every_header_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2)
    index = tmp_path / "INDEX"
    if damage == "flip":
        flip_byte(index, -3)
    elif damage in ("truncate", "empty"):
        os.truncate(index, 0 if damage == "empty" else index.stat().st_size - 1)
    elif damage == "version":
        flip_byte(index, 4)
    else:
        index.rename(tmp_path / "elsewhere")
        index.symlink_to(tmp_path / "elsewhere")
    headers = NoHeaderReads(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with open_cache(tmp_path) as cache:
            assert await present(cache, 1, 2) == [True, True]
    assert headers.reads == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "blobsdk.cache.disk"]
    refused = f"cache disk: ignored {index}: it is a symlink, not a regular file (nothing is followed out of the root)"
    assert warnings == ([refused] if damage == "symlink" else [])


async def test_a_root_it_may_not_write_opens_and_closes_without_an_index_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("blobsdk.cache._diskreload.write_index", refuse)
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with DiskCache(tmp_path, capacity_bytes=1 << 20) as cache:
            await fill(cache, 1)
    assert not (tmp_path / "INDEX").exists()
    refused = f"cache disk: cannot write {tmp_path}/INDEX: [Errno 13] Permission denied"
    assert [r.getMessage() for r in caplog.records] == [refused]


def test_an_index_keeps_the_creation_order_only_for_a_ttl() -> None:
    """A disk cache without a TTL loads its index file into one order, not two."""
    assert DiskCache(".", capacity_bytes=1)._ledger.index.by_age is None
    assert DiskCache(".", capacity_bytes=1, ttl_seconds=5)._ledger.index.by_age is not None
    index = Index(by_age=False)
    index.load([Entry(key(1), 10, 1.0, 1.0)])
    with pytest.raises(ValueError, match=r"^a TTL needs an index that keeps the creation order \(Index\(by_age=True\)\)$"):
        list(TtlPolicy(5).victims(index, 10.0))


def test_an_index_file_s_order_is_the_lru_order_and_only_a_ttl_sorts_by_age() -> None:
    """The index file lists entries least recently used first: a load takes that order as it
    is (no sort of a million entries at a restart), and sorts only the creation order a TTL
    needs."""
    old, young = Entry(key(1), 10, created=1.0, last_access=5.0), Entry(key(2), 10, created=2.0, last_access=4.0)
    plain = Index(by_age=False)
    plain.load([old, young], lru_ordered=True)
    assert list(plain.lru) == [key(1), key(2)]  # as listed, though key(2) was touched earlier
    timed = Index(by_age=True)
    timed.load([young, old], lru_ordered=True)
    assert (list(timed.lru), list(timed.by_age or {})) == ([key(2), key(1)], [key(1), key(2)])
    scanned = Index(by_age=False)
    scanned.load([old, young])  # a scan's entries come in directory order: sorted by access
    assert list(scanned.lru) == [key(2), key(1)]
    assert (scanned.used, scanned.tenant_bytes) == (20, {"default": 20})


def test_a_key_listed_twice_loads_once_as_its_most_recently_used_listing() -> None:
    """An index file another process forged may list a key twice: the load keeps the later
    listing (the file is least recently used first), in each order, and counts it once."""
    old = Entry(key(1), 10, created=1.0, last_access=1.0)
    other = Entry(key(2), 20, created=2.0, last_access=2.0)
    again = Entry(key(1), 30, created=3.0, last_access=3.0)
    index = Index(by_age=True, hold=True, per_tenant_lru=True)
    assert index.load([old, other, again], lru_ordered=True) == [old]
    assert list(index.lru.values()) == [other, again] and list((index.by_age or {}).values()) == [other, again]
    assert list((index.held or {}).values()) == [other, again] and list(index.tenant_entries("default")) == [other, again]
    assert (index.used, index.tenant_bytes) == (50, {"default": 50})
