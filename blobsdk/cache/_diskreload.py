"""How a disk cache (blobsdk/cache/disk.py) comes back after a restart: the index file
(blobsdk/cache/_indexfile.py) loaded at open, then reconciled with the directory shard by shard
in the background, and written again after that and at close; without a usable index file,
every entry file's header scanned instead.  Whatever the index file says was written by
anyone sharing the directory: an entry it lists is dropped if its key is no chunk key or
listed twice, reported once per open.

:class:`Reload` is a base of :class:`~blobsdk.cache.disk.DiskCache`, as
:class:`~blobsdk.cache._diskfiles.DiskFiles` is: the cache's state is one object's, and this
module holds the part of its methods that only a restart needs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..runtime.forksafe import Executor
from ..runtime.rootdir import RootDir, UnsafeEntry
from ._diskscan import FileTimes, scan_shard
from ._index import Entry, Index
from ._indexfile import INDEX_FILE, Dropped, Listing, by_shard_of, read_index, write_index
from .policy import PolicyChain, Victims

T = TypeVar("T")

log = logging.getLogger("blobsdk.cache.disk")  # one cache, one logger


class Reload:
    """The restart half of a DiskCache's methods (module docstring); the cache holds the state."""

    _root: Path
    _dir: RootDir
    _name: str
    _token: str
    _capacity: int
    _clock: Callable[[], float]
    _index: Index
    _chain: PolicyChain
    _counts: dict[str, int]
    _fills: Mapping[str, object]
    _pool: Executor
    _dropped: Dropped | None
    _touched: set[str] | None
    _saving: asyncio.Future[None] | None

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError  # DiskCache's: on its thread pool, refused once closed

    async def _remove_victims(self, victims: Victims) -> None:
        raise NotImplementedError  # DiskCache's: unlink evicted entries

    async def _scan_all(self) -> None:
        """Index every entry file by its header (shards scanned in parallel)."""
        shards = await self._io(self._dir.shards)
        scan = partial(scan_shard, self._dir, token=self._token, times=FileTimes(self._clock()))
        scans = await asyncio.gather(*(self._io(scan, shard) for shard in shards))
        self._counts["corrupt"] += sum(s.damaged for s in scans)
        self._index.load(entry for s in scans for entry in s.found)

    def _read_index(self) -> Listing | None:
        try:
            return read_index(str(self._root), self._clock())
        except UnsafeEntry as exc:
            self._dir.ignore(str(exc))
            return None

    def _load(self, listing: Listing) -> None:
        """Index what the index file lists, in its LRU order; what it lists that this cache does
        not write is reported once the keys are checked too (:meth:`_report_dropped`)."""
        repeats = self._index.load(listing.entries, lru_ordered=True)
        if repeats:
            listing.dropped.add(f"key {repeats[0].key} is listed more than once", len(repeats))
        self._dropped = listing.dropped

    def _report_dropped(self, foreign: list[Entry], why: str) -> None:
        """Drop the entries listed under keys that are not chunk keys, then report all that was
        dropped: once per open (from aclose if the reconciliation never got this far)."""
        for entry in foreign:
            if self._index.get(entry.key) is entry:
                self._index.remove(entry.key)
        dropped, self._dropped = self._dropped, None
        if dropped is not None and foreign:
            dropped.add(why, len(foreign))
        if dropped is not None and dropped.count:
            log.warning("cache %s: %s", self._name, dropped.describe(self._root / INDEX_FILE))

    async def _reconcile(self, loaded: list[Entry]) -> None:
        """After a start from the index file (``loaded``: its entries): bring the index in
        line with the directory, one shard at a time (files other processes added or removed
        since; only new files' headers are read), then write a fresh index file.  An entry
        replaced or removed meanwhile, or a key put or deleted since open, is not this scan's
        to judge (its file may be one the scan saw before a delete).  The entries are grouped by
        shard here, on the executor, not in :meth:`open`: ~0.4 s of a 10^6-entry restart; and
        first, those listed under a key that is not a chunk key are dropped and reported."""
        times = FileTimes(self._clock())
        try:
            by_shard, foreign, why = await self._io(by_shard_of, loaded)
            self._report_dropped(foreign, why)
            for shard in sorted(set(await self._io(self._dir.shards)) | set(by_shard)):
                known = by_shard.get(shard, [])
                scan = await self._io(scan_shard, self._dir, shard, token=self._token, times=times, known={e.key for e in known})
                self._counts["corrupt"] += scan.damaged
                for entry in known:
                    if entry.key not in scan.names and self._index.get(entry.key) is entry:
                        self._index.remove(entry.key)  # gone since the index file was written
                for entry in scan.found:
                    if entry.key not in self._index and entry.key not in self._fills and entry.key not in (self._touched or ()):
                        self._index.add(entry)  # another process's
            await self._remove_victims(self._chain.trim(self._index, self._capacity, self._clock()))
        except (OSError, UnsafeEntry) as exc:
            log.warning("cache %s: reconciling %s with its index file stopped: %s", self._name, self._root, exc)
            return
        finally:
            self._touched = None
        await self._save_index()

    async def _save_index(self) -> None:
        """Write the index file (what a restart loads); a failure is logged, never raised.
        One write at a time, in order: a write whose caller was cancelled (a reconciliation
        stopped by aclose) still runs on the pool, and must not land after a newer one."""
        if self._saving is not None:
            await asyncio.wait([self._saving])
        entries = [e for e in self._index.lru.values() if e.key not in self._fills]
        self._saving = asyncio.wrap_future(self._pool.submit(write_index, str(self._root), entries, self._clock(), self._token))
        try:
            await asyncio.shield(self._saving)
        except (OSError, UnsafeEntry) as exc:
            log.warning("cache %s: cannot write %s/%s: %s", self._name, self._root, INDEX_FILE, exc)
