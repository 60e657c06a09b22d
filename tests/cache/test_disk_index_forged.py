"""A forged index file (blobsdk/cache/_indexfile.py): another process sharing the directory
may write ``root/INDEX`` with a valid checksum and any entries.  Each entry is checked where
it enters; a bad one is dropped, with one warning per open however many there are, and no
trim, sweep or reconciliation ever names a path outside the root."""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import xxhash

import blobsdk
from blobsdk.cache._diskfiles import with_file
from blobsdk.cache._indexfile import _HEAD, _MAGIC, _VERSION, INDEX_FILE, Listing, _decode, by_shard_of
from blobsdk.config import L2Config
from blobsdk.runtime.rootdir import RootDir, UnsafeEntry, create_temp, open_regular, remove_if_dead, unlink_at
from blobsdk.testing.cache import FakeClock, blob, fill, key, present
from blobsdk.tiers import L2Tier

from .test_disk import chunk_file, open_cache
from .test_disk_index import NoHeaderReads

THEN = 5000.0  # the forged file's engine clock (a FakeClock starts at 1000)
PATH32 = "../../../../../victim/victim.txt"  # a path of 32 characters, as long as a chunk key


def row(n: int | str, size: Any = 100, *, created: Any = THEN - 10, last: Any = THEN - 5, tenant: Any = "default") -> list[Any]:
    """One index entry as the file lists it (``n``: a key number, or the key itself)."""
    return [key(n) if isinstance(n, int) else n, size, created, last, tenant, 0.0]


def forge(root: Path, rows: list[Any], *, then: float = THEN) -> None:
    """Write ``root/INDEX`` listing ``rows``, with a valid header and checksum."""
    body = msgspec.msgpack.encode(rows)
    head = _HEAD.pack(_MAGIC, _VERSION, len(body), xxhash.xxh3_64_intdigest(body), then, time.time())
    (root / INDEX_FILE).write_bytes(head + body)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "blobsdk.cache.disk" and r.levelno >= logging.WARNING]


def dropped(root: Path, count: int, total: int, first: str) -> str:
    return (
        f"cache disk: dropped {count} of the {total} entries of {root / INDEX_FILE}, not as this cache writes them "
        f"(the first: {first}); their files, if any, are indexed by their headers"
    )


def entry_files(root: Path) -> list[Path]:
    return [f for f in root.glob("??/*") if f.is_file()]


async def filled(root: Path, *ns: int) -> None:
    """``root``: a cache holding ``ns`` (100 bytes each), closed."""
    async with open_cache(root) as cache:
        await fill(cache, *ns)


@pytest.fixture
def share(tmp_path: Path) -> tuple[Path, Path]:
    """``(root, victim)``: a cache root two levels down and a file outside it that a key of
    ``../victim/victim.txt`` would name from the root's parent."""
    root, victim = tmp_path / "share" / "l2", tmp_path / "victim" / "victim.txt"
    root.mkdir(parents=True)
    victim.parent.mkdir()
    victim.write_bytes(b"not the cache's")
    return root, victim


async def test_a_forged_key_never_deletes_a_file_outside_the_root(
    share: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the key ``../victim/victim.txt``, as large as the capacity, was the trim's first
    victim and its file was unlinked from the root's parent.  Now it is dropped as the file is
    read (not 32 characters), and one of 32 that names the same file (its digits are checked
    when the reconciliation starts) is a victim whose eviction removes nothing."""
    root, victim = share
    await filled(root, 1)
    forge(root, [row("../victim/victim.txt", 10**6), row(PATH32, 10**6), row(1)])
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with open_cache(root, capacity=1000, clock=FakeClock(THEN)) as cache:
            assert await present(cache, 1) == [True] and victim.exists()
            await cache.reconciled()
            assert bytes(await cache.get(key(1)) or b"") == blob(1) and cache.used_bytes == 100
            assert cache.stats()["errors"] == 0
    assert victim.read_bytes() == b"not the cache's"
    assert warnings_of(caplog) == [dropped(root, 2, 3, "entry 0: Expected `str` of length >= 32 - at `$[0]`")]


async def test_the_reconciliation_never_scans_the_root_s_parent(share: tuple[Path, Path]) -> None:
    """Before: the forged key's shard was ``..``, and the reconciliation swept the temp files of
    the root's parent as a shard's."""
    root, _ = share
    results = root.parent / "results.tmp"
    results.write_bytes(b"a job's output")
    await filled(root, 1)
    forge(root, [row("../victim/victim.txt", 10), row(PATH32, 10), row("..xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 10), row(1)])
    async with open_cache(root, clock=FakeClock(THEN)) as cache:
        await cache.reconciled()
        assert await present(cache, 1) == [True] and cache.stats()["entries"] == 1
    assert results.read_bytes() == b"a job's output"


async def test_a_forged_negative_size_cannot_let_the_cache_outgrow_its_capacity(tmp_path: Path) -> None:
    """Before: an entry of -10^15 bytes (its file real) kept ``used_bytes`` negative, and the
    cache grew to 5 times its capacity."""
    await filled(tmp_path, 9)
    forge(tmp_path, [row(9, -(10**15))])
    async with open_cache(tmp_path, capacity=1000, clock=FakeClock(THEN)) as cache:
        await cache.reconciled()  # finds 9's file, by its header: 100 bytes
        await fill(cache, *range(10, 60))
        assert cache.used_bytes <= 1000 and cache.stats()["entries"] <= 10
    assert len(entry_files(tmp_path)) <= 10


async def test_a_forged_huge_size_evicts_nothing(tmp_path: Path) -> None:
    """Before: an entry of 2^63 bytes made the open trim every other entry off the disk."""
    await filled(tmp_path, 1, 2)
    forge(tmp_path, [row(1, 2**63), row(2)])
    async with open_cache(tmp_path, capacity=1000, clock=FakeClock(THEN)) as cache:
        assert await present(cache, 1, 2) == [False, True]
        await cache.reconciled()
        assert await present(cache, 1, 2) == [True, True] and cache.used_bytes == 200
    assert chunk_file(tmp_path, 1).exists() and chunk_file(tmp_path, 2).exists()


async def test_a_key_listed_twice_is_counted_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: both listings were counted, 200 bytes for a 100-byte entry, for good."""
    await filled(tmp_path, 1)
    forge(tmp_path, [row(1), row(1, last=THEN - 1)])
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with open_cache(tmp_path, clock=FakeClock(THEN)) as cache:
            assert (cache.used_bytes, cache.stats()["entries"], cache.tenant_usage()) == (100, 1, {"default": 100})
            assert await cache.delete(key(1)) and (cache.used_bytes, cache.tenant_usage()) == (0, {})
    assert warnings_of(caplog) == [dropped(tmp_path, 1, 2, f"key {key(1)} is listed more than once")]


LATER = "later"  # dropped when the reconciliation starts: a key of 32 characters, not hex digits
BAD_ROWS = {
    "key with a path": (row("../victim/victim.txt"), "entry 1: Expected `str` of length >= 32 - at `$[0]`"),
    "key of a shard's name": (row("ab"), "entry 1: Expected `str` of length >= 32 - at `$[0]`"),
    "key of a megabyte": (row("ab" * 2**19), "entry 1: Expected `str` of length <= 32 - at `$[0]`"),
    "key of 32 path characters": (row(PATH32), f"{LATER}: invalid chunk key '{PATH32}': want 32 lowercase hex digits"),
    "key in upper case": (row("A" * 32), f"{LATER}: invalid chunk key '{'A' * 32}': want 32 lowercase hex digits"),
    "key with a NUL": (row("0" * 31 + "\0"), f"{LATER}: invalid chunk key '{'0' * 31}\\x00': want 32 lowercase hex digits"),
    "key not a string": ([12345, *row(7)[1:]], "entry 1: Expected `str`, got `int` - at `$[0]`"),
    "negative size": (row(7, -(10**15)), "entry 1: Expected `int` >= 0 - at `$[1]`"),
    "huge size": (row(7, 2**63), "entry 1: Expected `int` <= 1099511627776 - at `$[1]`"),
    "size not an int": (row(7, "100"), "entry 1: Expected `int`, got `str` - at `$[1]`"),
    "size a float": (row(7, 100.5), "entry 1: Expected `int`, got `float` - at `$[1]`"),
    "size a bool": (row(7, True), "entry 1: Expected `int`, got `bool` - at `$[1]`"),
    "NaN creation": (row(7, created=math.nan), "entry 1: Expected `float` >= -1e+18 - at `$[2]`"),
    "infinite last access": (row(7, last=math.inf), "entry 1: Expected `float` <= 1e+18 - at `$[3]`"),
    "last access after the file": (
        row(7, last=THEN + 1),
        f"entry 1: its times (4990.0, {THEN + 1}) are after the file's clock ({THEN})",
    ),
    "creation after the file": (
        row(7, created=THEN + 1e9),
        f"entry 1: its times ({THEN + 1e9}, 4995.0) are after the file's clock ({THEN})",
    ),
    "empty tenant": (row(7, tenant=""), "entry 1: Expected `str` of length >= 1 - at `$[4]`"),
    "tenant of 256 bytes": (row(7, tenant="é" * 128), "entry 1: invalid tenant '" + "é" * 128 + "': want 1 to 255 UTF-8 bytes"),
    "tenant of 400 bytes": (row(7, tenant="é" * 200), f"entry 1: invalid tenant '{'é' * 200}"[:200] + "..."),
    "not an array": (7, "entry 1: Expected `array`, got `int`"),
    "too short": ([key(7), 100], "entry 1: Expected `array` of at least length 4, got 2"),
}


@pytest.mark.parametrize("bad", BAD_ROWS.values(), ids=BAD_ROWS.keys())
async def test_each_bad_entry_is_dropped_with_one_warning_and_the_others_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, bad: tuple[Any, str]
) -> None:
    """Before: a bad entry was loaded as it came (a path for a key, a negative size, a NaN
    time), or, for a wrong type, the whole file was ignored and every header read, with no
    word either way.  A key of 32 characters that are not hex digits is indexed at open (it
    names no file) and dropped as the reconciliation starts."""
    await filled(tmp_path, 1, 2, 7)
    forge(tmp_path, [row(1), bad[0], row(2)])
    later = bad[1].startswith(LATER)
    headers = NoHeaderReads(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with open_cache(tmp_path, clock=FakeClock(THEN)) as cache:
            assert await present(cache, 1, 2, 7) == [True, True, False]  # from the index file
            assert headers.reads == 0 and cache.stats()["entries"] == (3 if later else 2)
            await cache.reconciled()
            assert await present(cache, 1, 2, 7) == [True, True, True]  # 7's file, by its header
            assert cache.stats()["entries"] == 3 and cache.used_bytes == 300
    assert headers.reads == 1
    assert warnings_of(caplog) == [dropped(tmp_path, 1, 3, bad[1].removeprefix(f"{LATER}: "))]


async def test_a_long_tenant_name_within_255_bytes_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A tenant name longer than the quick check's bound is still a tenant name: checked
    entry by entry, kept, and no warning."""
    long = "t" * 255
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, tenant=long)
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with open_cache(tmp_path) as cache:
            assert cache.tenant_usage() == {long: 100} and await present(cache, 1) == [True]
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("reconciled", [True, False], ids=["reconciled", "closed at once"])
async def test_many_bad_entries_make_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture, reconciled: bool) -> None:
    """One warning per open, however many entries are dropped, as the file is read or as the
    reconciliation starts (here 10^4, each a key naming a path outside the root, half of them
    32 characters long, each as large as the cache: the trim at open takes them all)."""
    await filled(tmp_path, 1)
    forge(tmp_path, [row(f"../{n:029}" if n % 2 else f"../{n}", 10**6) for n in range(10_000)] + [row(1)])
    with caplog.at_level(logging.WARNING, logger="blobsdk.cache.disk"):
        async with open_cache(tmp_path, capacity=1000, clock=FakeClock(THEN)) as cache:
            if reconciled:
                await cache.reconciled()
                assert await present(cache, 1) == [True] and cache.used_bytes == 100
    first = "entry 0: Expected `str` of length >= 32 - at `$[0]`"
    count = 10_000 if reconciled else 5_000  # else the other half is in the index file aclose wrote
    assert warnings_of(caplog) == [dropped(tmp_path, count, 10_001, first)]


async def test_a_size_the_file_contradicts_is_corrected_at_the_first_read(tmp_path: Path) -> None:
    """The index file said 1 byte for a 100-byte entry: its read counts the 100."""
    await filled(tmp_path, 1, 2)
    forge(tmp_path, [row(1, 1), row(2)])
    async with open_cache(tmp_path, clock=FakeClock(THEN)) as cache:
        assert cache.used_bytes == 101
        assert bytes(await cache.get(key(1)) or b"") == blob(1)
        assert (cache.used_bytes, cache.tenant_usage()) == (200, {"default": 200})


async def test_a_forged_index_through_the_client_deletes_nothing_outside_the_l2_root(share: tuple[Path, Path]) -> None:
    """The same attack through ``Client.local(l2=...)``: the trim at open and the background
    reconciliation leave the victim and the parent's temp file alone."""
    root, victim = share
    results = root.parent / "results.tmp"
    results.write_bytes(b"a job's output")
    await filled(root, 1)
    forge(root, [row("../victim/victim.txt", 10**6), row(1)])
    l2 = L2Config(dir=str(root), capacity_bytes=1000, min_free_ratio=0)
    async with blobsdk.Client.local(root.parent.parent / "data", l2=l2) as client:
        tier = next(t for t in client._state.readpath.tiers if isinstance(t, L2Tier))  # type: ignore[union-attr]
        await tier.cache.reconciled()
        assert tier.cache.contains(key(1)) and tier.cache.used_bytes == 100
    assert victim.read_bytes() == b"not the cache's" and results.read_bytes() == b"a job's output"


def decoded(rows: list[Any]) -> Listing:
    body = msgspec.msgpack.encode(rows)
    data = _HEAD.pack(_MAGIC, _VERSION, len(body), xxhash.xxh3_64_intdigest(body), THEN, time.time()) + body
    listing = _decode(memoryview(data), THEN)
    assert listing is not None
    return listing


@pytest.mark.parametrize("bad", BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_the_whole_file_check_and_the_entry_by_entry_check_agree(bad: tuple[Any, str]) -> None:
    """The index file's two paths (every entry checked at once, as it decodes; entry by entry
    when that fails) keep and drop alike: each bad row with good ones, alone or beside
    another that sends the file entry by entry."""
    later = bad[1].startswith(LATER)
    for rows in ([row(1), bad[0], row(2)], [row(1), bad[0], row(2), row(3, -1)]):
        listing = decoded(rows)
        keys = [e.key for e in listing.entries]
        assert keys == ([key(1), bad[0][0], key(2)] if later else [key(1), key(2)])
        assert (listing.dropped.listed, listing.dropped.count) == (len(rows), len(rows) - 2 - later)
        grouped, foreign, why = by_shard_of(listing.entries)
        assert [e.key for e in foreign] == keys[1:2] * later and why == bad[1].removeprefix(f"{LATER}: ") * later
        assert sorted(e.key for group in grouped.values() for e in group) == [key(1), key(2)]


def test_a_good_file_is_read_whole_and_its_keys_in_one_pass() -> None:
    listing = decoded([row(1), row(2, tenant="t" * 63)])
    assert [e.key for e in listing.entries] == [key(1), key(2)] and listing.dropped.count == 0
    assert {type(e).__name__ for e in listing.entries} == {"_Quick"}  # not entry by entry
    assert by_shard_of(listing.entries) == ({key(1)[:2]: listing.entries}, [], "")


def test_no_file_operation_of_a_root_names_a_path_outside_it(share: tuple[Path, Path]) -> None:
    """Defence in depth below the index file's checks: a shard that is not two hex digits, a
    file name that is a path, and a cache key that is not a chunk key are refused by the
    operations themselves (before: ``..`` opened the root's parent and a path unlinked the
    victim)."""
    root, victim = share
    (root / "ab").mkdir()
    where = RootDir(root, label="cache test", log=logging.getLogger("test"))
    with pytest.raises(UnsafeEntry) as refused:
        where.open_shard("..")
    assert str(refused.value) == f"'{root}/..': not a name of a shard directory (nothing is named outside the root)"
    fd = where.open_shard("ab")
    try:
        for name in ("../../victim/victim.txt", "..", "", "a\0b"):
            for operation in (lambda n: unlink_at(fd, n), lambda n: open_regular(fd, n, n), lambda n: create_temp(fd, n, "t")):
                with pytest.raises(UnsafeEntry) as refused:
                    operation(name)
                assert (
                    str(refused.value) == f"{name!r}: not a name of a file in its directory (nothing is named outside the root)"
                )
            assert not remove_if_dead(fd, name)
    finally:
        os.close(fd)
    cache = open_cache(root)
    assert not cache._files.remove(PATH32)  # a victim listed by a forged index file: nothing to remove
    with pytest.raises(UnsafeEntry) as refused:
        with_file(cache._files.dir, PATH32, lambda fd, key: None)
    assert str(refused.value) == f"{PATH32!r}: not a name of a cache entry's file (nothing is named outside the root)"
    assert victim.read_bytes() == b"not the cache's"
