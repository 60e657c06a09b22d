"""The disk cache's background reconciliation (blobsdk/cache/_disk.py) racing the cache's own
work: the two races that made tests/cache/test_stateful.py::TestDiskMachine flaky, pinned
with events (no timing): the executor job of each step is held at the exact point."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from blobsdk.cache import _diskreload as disk  # the restart path: its scan and index writes
from blobsdk.cache._indexfile import write_index
from blobsdk.testing.cache import blob, fill, key, present

from .test_disk import chunk_file, open_cache
from .test_disk_index import listed

WAIT = 10.0  # seconds; only bounds a broken test, no outcome depends on it


async def test_a_file_the_reconciliation_saw_before_a_delete_is_not_indexed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
    start, scanned, go = threading.Event(), threading.Event(), threading.Event()
    real = disk.scan_shard

    def held(*args: Any, **kwargs: Any) -> Any:
        start.wait(WAIT)
        scan = real(*args, **kwargs)
        scanned.set()
        go.wait(WAIT)  # the scan has seen key 2's file; its result is not used yet
        return scan

    monkeypatch.setattr(disk, "scan_shard", held)
    async with open_cache(tmp_path) as cache:
        await fill(cache, 2)  # after open: a file the index file does not name
        start.set()
        await asyncio.to_thread(scanned.wait, WAIT)
        assert await cache.delete(key(2))
        go.set()
        await cache.reconciled()
        assert await present(cache, 1, 2) == [True, False]
        assert cache.used_bytes == 100
    assert not chunk_file(tmp_path, 2).exists()
    assert [e.key for e in listed(tmp_path)] == [key(1)]


async def test_an_index_write_stopped_by_aclose_never_lands_after_aclose_writes_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1)
    writing, release, second_written = threading.Event(), threading.Event(), threading.Event()
    submitted: list[int] = []  # index writes handed to the pool
    real = disk.write_index

    def held(*args: Any) -> None:
        if len(submitted) == 1:  # the reconciliation's, of the entries as they were: key 1
            writing.set()
            release.wait(WAIT)
            if len(submitted) == 2:  # aclose's went ahead: let it land first (before the fix)
                second_written.wait(WAIT)
            real(*args)
        else:
            real(*args)
            second_written.set()

    monkeypatch.setattr(disk, "write_index", held)
    cache = await open_cache(tmp_path).open()
    submit = cache._disk.submit

    def counted(fn: Any, *args: Any) -> Any:
        if fn is held:
            submitted.append(1)
        return submit(fn, *args)

    monkeypatch.setattr(cache._disk, "submit", counted)
    await asyncio.to_thread(writing.wait, WAIT)
    assert await cache.delete(key(1))
    await fill(cache, 2)
    closing = asyncio.create_task(cache.aclose())  # stops the reconciliation mid-write
    for _ in range(20):  # loop turns, not time: aclose gets as far as it can
        await asyncio.sleep(0)
    release.set()
    await closing
    assert [e.key for e in listed(tmp_path)] == [key(2)]
    async with open_cache(tmp_path) as cache:
        assert await present(cache, 1, 2) == [False, True]
        assert bytes(await cache.get(key(2)) or b"") == blob(2)


async def test_evictions_the_reconciliation_began_finish_when_aclose_stops_it(tmp_path: Path) -> None:
    """Another process's files push the cache over capacity; the reconciliation evicts, and
    aclose stops it while the first file is being removed: every victim's file still goes
    (before, the rest stayed on disk, unindexed and over capacity, until the next start)."""
    async with open_cache(tmp_path) as cache:
        await fill(cache, 1, 2, 3)
    entries = listed(tmp_path)
    write_index(str(tmp_path), [e for e in entries if e.key == key(1)], 0.0, "test")  # names key 1 only
    removing, release = threading.Event(), threading.Event()
    cache = await open_cache(tmp_path, capacity=100).open()
    real = cache._files.remove

    def held(name: str) -> bool:
        removing.set()
        release.wait(WAIT)
        return real(name)

    cache._files.remove = held  # type: ignore[method-assign]
    await asyncio.to_thread(removing.wait, WAIT)  # it found keys 2 and 3, evicts two of the three
    closing = asyncio.create_task(cache.aclose())
    for _ in range(20):  # loop turns, not time: aclose cancels the reconciliation
        await asyncio.sleep(0)
    release.set()
    await closing
    on_disk = sorted(p.name for p in (tmp_path / key(1)[:2]).iterdir())
    assert len(on_disk) == 1 and on_disk == [e.key for e in listed(tmp_path)]
