"""DiskCache.open_verified (remember_verified): the file a verified read saw, handed out open."""

from __future__ import annotations

import os
from pathlib import Path

from blobsdk.cache import PayloadFile
from blobsdk.cache._payloadfile import VerifiedFiles, identity
from tests.cache.test_disk import open_cache

KEY, OTHER = "ab" + "0" * 30, "cd" + "1" * 30


def payload_of(opened: PayloadFile | None) -> bytes:
    """The payload of an open entry file, which this closes."""
    assert opened is not None
    with opened:
        return os.pread(opened.file.fileno(), opened.length, opened.offset)


async def test_a_file_is_handed_out_only_once_a_read_verified_it(tmp_path: Path) -> None:
    async with open_cache(tmp_path, remember_verified=True) as cache:
        assert await cache.put(KEY, b"hello world")
        assert await cache.open_verified(KEY) is None  # written, never read
        assert await cache.open_verified(OTHER) is None  # absent
        assert await cache.get(KEY) == b"hello world"
        opened = await cache.open_verified(KEY)
        assert opened is not None and (opened.offset, opened.length) == ((cache.root / KEY[:2] / KEY).stat().st_size - 11, 11)
        assert payload_of(opened) == b"hello world"
        assert cache.stats()["hits"] == 2
        cache.forget_verified(KEY)
        assert await cache.open_verified(KEY) is None
        assert await cache.get(KEY) == b"hello world"
        assert await cache.put(KEY, b"hello again")  # a new file: verified again first
        assert await cache.open_verified(KEY) is None
        assert await cache.get(KEY) == b"hello again"
        assert payload_of(await cache.open_verified(KEY)) == b"hello again"
        assert await cache.delete(KEY)
        assert await cache.open_verified(KEY) is None


async def test_a_replaced_file_is_not_handed_out(tmp_path: Path) -> None:
    async with open_cache(tmp_path, remember_verified=True) as cache:
        assert await cache.put(KEY, b"hello world")
        assert await cache.get(KEY) == b"hello world"
        path = cache.root / KEY[:2] / KEY
        copy = path.with_name("copy")
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)  # the same bytes, another inode (another process's fill)
        assert await cache.open_verified(KEY) is None
        assert await cache.get(KEY) == b"hello world"
        assert payload_of(await cache.open_verified(KEY)) == b"hello world"


async def test_without_remember_verified_nothing_is_handed_out(tmp_path: Path) -> None:
    async with open_cache(tmp_path) as cache:
        assert await cache.put(KEY, b"hello world")
        assert await cache.get(KEY) == b"hello world"
        assert await cache.open_verified(KEY) is None


def test_verified_files_keep_twice_the_live_entries_plus_slack(tmp_path: Path) -> None:
    files = VerifiedFiles()
    ident = identity(os.stat(tmp_path))
    for i in range(100):
        files.record(f"k{i}", ident, live_entries=10)
    assert len(files) == 2 * 10 + 64
    assert files.get("k99") == ident and files.get("k15") is None and files.get("k16") == ident
