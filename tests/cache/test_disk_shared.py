"""A disk cache finds the files another process sharing its directory wrote after it opened
(blobsdk/cache/_diskshare.py): read, verified and adopted on the first read that misses the
index; whatever such a file holds, never wrong bytes, never a symlink followed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import xxhash

from blobsdk.cache import DiskCache
from blobsdk.sources.base import new_block_id
from blobsdk.testing.cache import blob
from blobsdk.tiers import L2Tier
from blobsdk.wire import ChunkRef
from tests.writer_process import FIRST, SECOND, WriterProcess

NOTE = "(nothing is followed out of the root)"


def key_of(n: int) -> str:
    return f"ab{n:030x}"


def cache(root: Path, capacity: int = 1 << 20, **options: object) -> DiskCache:
    return DiskCache(root, capacity_bytes=capacity, min_free_ratio=0, name="l2", **options)  # type: ignore[arg-type]


def file_of(root: Path, key: str) -> Path:
    return root / key[:2] / key


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "blobsdk.cache.disk"]


def counts(c: DiskCache) -> dict[str, int | float]:
    stats = c.stats()
    return {k: stats[k] for k in ("hits", "misses", "corrupt", "errors", "entries", "bytes")}


async def test_a_chunk_another_cache_on_the_directory_put_since_it_opened_is_a_hit(tmp_path: Path) -> None:
    async with cache(tmp_path) as a, cache(tmp_path) as b:
        assert await a.put(key_of(1), blob(1, 1000))
        assert not b.contains(key_of(1))  # the index alone: no disk access on the event loop
        assert await b.get(key_of(1), checksum=xxhash.xxh3_64_intdigest(blob(1, 1000))) == blob(1, 1000)
        assert b.contains(key_of(1))  # adopted
        assert await b.get(key_of(1)) == blob(1, 1000)
        assert counts(b) == {"hits": 2, "misses": 0, "corrupt": 0, "errors": 0, "entries": 1, "bytes": 1000}


async def test_a_missing_file_is_a_plain_miss(tmp_path: Path) -> None:
    async with cache(tmp_path) as c:
        assert await c.put(key_of(1), blob(1))
        assert await c.get(key_of(2)) is None  # its shard exists
        assert await c.get(f"cd{0:030x}") is None  # its shard does not
        assert counts(c) == {"hits": 0, "misses": 2, "corrupt": 0, "errors": 0, "entries": 1, "bytes": 100}


def chunk(raw: bytes) -> ChunkRef:
    n = len(raw)
    return ChunkRef(block_id=new_block_id(), offset=0, length=n, raw_length=n, checksum=xxhash.xxh3_64_intdigest(raw))


async def never(ref: ChunkRef, raw: memoryview) -> memoryview:
    raise AssertionError("L2 never decodes")


async def test_the_l2_tier_hits_a_chunk_another_process_wrote_after_it_opened(tmp_path: Path) -> None:
    ref, root = chunk(FIRST + SECOND), tmp_path / "l2"
    async with L2Tier(cache(root)) as tier:
        async with WriterProcess("cache", root, ref.key) as writer:  # paused mid-write
            assert await tier.fetch(ref, never) is None  # a fill in progress is no entry
            assert await writer.finish() == "committed"
        got = await tier.fetch(ref, never)
        assert got is not None and bytes(got) == FIRST + SECOND
        assert tier.holds(ref) and tier.stats.hits == 1 and tier.stats.misses == 1


async def test_open_verified_hands_out_an_adopted_file_once_read(tmp_path: Path) -> None:
    async with cache(tmp_path) as a, cache(tmp_path, remember_verified=True) as b:
        assert await a.put(key_of(1), blob(1))
        assert await b.open_verified(key_of(1)) is None  # not yet verified: the caller reads it
        assert await b.get(key_of(1)) == blob(1)
        opened = await b.open_verified(key_of(1))
        assert opened is not None and opened.length == 100
        opened.close()


FORGERIES = {
    "payload bit flipped": lambda good, other: good[:-1] + bytes([good[-1] ^ 1]),
    "truncated": lambda good, other: good[:-10],
    "another key's file": lambda good, other: other,
    "not a cache file": lambda good, other: b"not a cache file",
    "empty": lambda good, other: b"",
}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
async def test_a_forged_file_under_the_key_is_a_miss_and_deleted(tmp_path: Path, forge: object) -> None:
    maker = tmp_path / "maker"
    async with cache(maker) as m:
        assert await m.put(key_of(1), blob(1)) and await m.put(key_of(2), blob(2))
    good, other = file_of(maker, key_of(1)).read_bytes(), file_of(maker, key_of(2)).read_bytes()
    root = tmp_path / "l2"
    async with cache(root) as c:
        file_of(root, key_of(1)).parent.mkdir()
        file_of(root, key_of(1)).write_bytes(forge(good, other))  # type: ignore[operator]
        assert await c.get(key_of(1)) is None
        assert not file_of(root, key_of(1)).exists()
        assert counts(c) == {"hits": 0, "misses": 1, "corrupt": 1, "errors": 0, "entries": 0, "bytes": 0}


async def test_a_sound_file_of_other_bytes_than_the_caller_expects_is_a_miss_and_deleted(tmp_path: Path) -> None:
    async with cache(tmp_path) as a, cache(tmp_path) as b:
        assert await a.put(key_of(1), blob(1))
        assert await b.get(key_of(1), checksum=xxhash.xxh3_64_intdigest(blob(2))) is None
        assert not file_of(tmp_path, key_of(1)).exists()
        assert counts(b) == {"hits": 0, "misses": 1, "corrupt": 1, "errors": 0, "entries": 0, "bytes": 0}


async def test_a_symlink_under_the_key_is_never_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    maker = tmp_path / "maker"
    async with cache(maker) as m:
        assert await m.put(key_of(1), blob(1))
    target = file_of(maker, key_of(1))
    before = target.read_bytes()
    root = tmp_path / "l2"
    async with cache(root) as c:
        file_of(root, key_of(1)).parent.mkdir()
        file_of(root, key_of(1)).symlink_to(target)  # a sound file, of the right key, elsewhere
        with caplog.at_level(logging.WARNING):
            assert await c.get(key_of(1)) is None
            assert await c.get(key_of(1)) is None
        assert counts(c) == {"hits": 0, "misses": 2, "corrupt": 0, "errors": 2, "entries": 0, "bytes": 0}
        assert file_of(root, key_of(1)).is_symlink()  # a read deletes nothing through it
    assert target.read_bytes() == before
    link = file_of(root, key_of(1))
    assert messages(caplog) == [f"cache l2: ignored {link}: it is a symlink, not a regular file {NOTE}"]


async def test_adopted_entries_count_toward_capacity(tmp_path: Path) -> None:
    async with cache(tmp_path, capacity=1 << 20) as a, cache(tmp_path, capacity=250) as b:
        for n in (1, 2, 3):
            assert await a.put(key_of(n), blob(n))
        for n in (1, 2, 3):
            assert await b.get(key_of(n)) == blob(n)
        assert b.used_bytes == 200 and [b.contains(key_of(n)) for n in (1, 2, 3)] == [False, True, True]
        assert b.stats()["evictions"] == 1
        assert not file_of(tmp_path, key_of(1)).exists()  # evicted by b: the directory stays bounded


async def test_an_adopted_file_past_the_ttl_is_expired(tmp_path: Path) -> None:
    async with cache(tmp_path) as a, cache(tmp_path, ttl_seconds=60.0) as b:
        assert await a.put(key_of(1), blob(1))
        path = file_of(tmp_path, key_of(1))
        st = path.stat()
        os.utime(path, (st.st_atime - 3600, st.st_mtime - 3600))  # filled an hour ago
        assert await b.get(key_of(1)) is None
        assert not path.exists() and counts(b)["entries"] == 0 and counts(b)["misses"] == 1


async def test_find_indexes_another_process_s_file_by_its_header_and_counts_no_read(tmp_path: Path) -> None:
    async with cache(tmp_path) as a, cache(tmp_path) as b:
        assert await a.put(key_of(1), blob(1))
        assert not await b.find(key_of(2))
        assert await b.find(key_of(1), checksum=xxhash.xxh3_64_intdigest(blob(1)))
        assert b.contains(key_of(1)) and await b.find(key_of(1))
        assert counts(b) == {"hits": 0, "misses": 0, "corrupt": 0, "errors": 0, "entries": 1, "bytes": 100}
        assert await b.get(key_of(1)) == blob(1)  # the payload verified at its read


async def test_find_deletes_a_file_that_records_other_bytes_than_the_caller_expects(tmp_path: Path) -> None:
    async with cache(tmp_path) as a, cache(tmp_path) as b:
        assert await a.put(key_of(1), blob(1))
        assert not await b.find(key_of(1), checksum=xxhash.xxh3_64_intdigest(blob(2)))
        assert not file_of(tmp_path, key_of(1)).exists()
        assert counts(b) == {"hits": 0, "misses": 0, "corrupt": 1, "errors": 0, "entries": 0, "bytes": 0}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
async def test_find_never_adopts_a_forged_file(tmp_path: Path, forge: object) -> None:
    maker = tmp_path / "maker"
    async with cache(maker) as m:
        assert await m.put(key_of(1), blob(1)) and await m.put(key_of(2), blob(2))
    good, other = file_of(maker, key_of(1)).read_bytes(), file_of(maker, key_of(2)).read_bytes()
    root = tmp_path / "l2"
    async with cache(root) as c:
        file_of(root, key_of(1)).parent.mkdir()
        file_of(root, key_of(1)).write_bytes(forge(good, other))  # type: ignore[operator]
        found = await c.find(key_of(1))
        # A flipped payload bit passes the header: indexed, then caught and deleted at its read.
        assert await c.get(key_of(1)) is None
        assert not file_of(root, key_of(1)).exists()
        assert counts(c)["corrupt"] == 1 and counts(c)["entries"] == 0 and counts(c)["hits"] == 0
        assert found == (forge is FORGERIES["payload bit flipped"])


async def test_find_never_follows_a_symlink(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    maker = tmp_path / "maker"
    async with cache(maker) as m:
        assert await m.put(key_of(1), blob(1))
    root = tmp_path / "l2"
    async with cache(root) as c:
        file_of(root, key_of(1)).parent.mkdir()
        file_of(root, key_of(1)).symlink_to(file_of(maker, key_of(1)))
        with caplog.at_level(logging.WARNING):
            assert not await c.find(key_of(1))
        assert counts(c)["errors"] == 1 and not c.contains(key_of(1)) and file_of(root, key_of(1)).is_symlink()
    assert messages(caplog) == [f"cache l2: ignored {file_of(root, key_of(1))}: it is a symlink, not a regular file {NOTE}"]


def with_length(good: bytes, key: str, length: int) -> bytes:
    """``good``'s header claiming a payload of ``length`` bytes: a sound header (its checksum is
    anyone's to compute) that records the real payload's checksum."""
    from blobsdk.cache._entryfile import HEAD, header_check

    magic, version, name_len, _, checksum, _ = HEAD.unpack_from(good)
    tenant = good[HEAD.size : HEAD.size + name_len]
    fixed = HEAD.pack(magic, version, name_len, length, checksum, 0)[:-8]
    return fixed + header_check(fixed, tenant, key).to_bytes(8, "little") + tenant


@pytest.mark.parametrize("look", ["fetch", "find"])
async def test_a_file_claiming_a_huge_payload_is_a_miss_never_an_allocation(tmp_path: Path, look: str) -> None:
    """A sparse file of a terabyte under the key, whose header records the chunk's own checksum:
    the L2 tier knows the chunk's length, so the file is damaged before a byte is allocated for
    it or its size counted (it was a MemoryError out of the read, or an entry of a terabyte)."""
    raw = blob(1, 1000)
    ref = chunk(raw)
    maker, root = tmp_path / "maker", tmp_path / "l2"
    async with cache(maker) as m:
        assert await m.put(ref.key, raw)
    head = with_length(file_of(maker, ref.key).read_bytes(), ref.key, 1 << 40)
    async with L2Tier(cache(root)) as tier:
        path = file_of(root, ref.key)
        path.parent.mkdir()
        with path.open("wb") as f:
            f.write(head)
            f.truncate(len(head) + (1 << 40))  # sparse: no disk spent
        if look == "find":
            assert not await tier.finds(ref)
        else:
            assert await tier.fetch(ref, never) is None
        assert not path.exists()
        misses = 1 if look == "fetch" else 0
        assert counts(tier.cache) == {"hits": 0, "misses": misses, "corrupt": 1, "errors": 0, "entries": 0, "bytes": 0}
