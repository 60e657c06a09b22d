"""How a disk cache (blobsdk/cache/_disk.py) comes back after a restart: the index file
(blobsdk/cache/_indexfile.py) loaded at open, then reconciled with the directory shard by shard
in the background, and written again after that and at close; without a usable index file,
every entry file's header scanned instead.  Whatever the index file says was written by
anyone sharing the directory: an entry it lists is dropped if its key is no chunk key or
listed twice, reported once per open.

:class:`Reload` does this for the cache, over the cache's ledger and pool
(blobsdk/cache/_diskstate.py), and owns the background reconciliation's task.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from ..runtime import UnsafeEntry
from ._diskscan import FileTimes, scan_shard
from ._diskstate import DiskPool, Ledger
from ._index import Entry
from ._indexfile import INDEX_FILE, Dropped, Listing, by_shard_of, read_index, write_index

log = logging.getLogger("blobsdk.cache.disk")  # one cache, one logger


class Reload:
    """A disk cache's restart (module docstring): :meth:`restore` at open, then
    :meth:`reconcile_in_background`; :meth:`save` and :meth:`stop` at close.  Keys put or
    deleted meanwhile are told with :meth:`touch`: not the reconciliation's to judge."""

    def __init__(self, ledger: Ledger, disk: DiskPool) -> None:
        self._ledger = ledger
        self._disk = disk
        self._files = disk.files
        self._name = disk.files.name
        self._reconciling: asyncio.Task[None] | None = None
        self._saving: asyncio.Future[None] | None = None  # the last index file write (save)
        self._touched: set[str] | None = None  # keys put or deleted while reconciling
        self._dropped: Dropped | None = None  # the index file's entries dropped at open, not yet reported

    async def restore(self) -> Listing | None:
        """Index what the index file lists, else every entry file by its header; the listing,
        or None if there was no usable index file."""
        listing = await self._disk.run(self._read_index)
        if listing is None:
            await self._scan_all()
        else:
            self._load(listing)
        return listing

    def reconcile_in_background(self, listing: Listing) -> None:
        """Start bringing the index in line with the directory (:meth:`_reconcile`)."""
        self._touched = set()
        self._reconciling = asyncio.create_task(self._reconcile(listing.entries), name=f"blobsdk-{self._name}-reconcile")

    def touch(self, key: str) -> None:
        """``key`` was put or deleted: a reconciliation running leaves it alone."""
        if self._touched is not None:
            self._touched.add(key)

    async def reconciled(self) -> None:
        """Wait until the reconciliation, if one was started, is done."""
        if self._reconciling is not None:
            await asyncio.shield(self._reconciling)

    async def stop(self) -> None:
        """Stop the reconciliation, and report what the index file listed that was dropped
        if it stopped before it checked the keys."""
        if self._reconciling is not None:
            self._reconciling.cancel()
            await asyncio.gather(self._reconciling, return_exceptions=True)
        self._report_dropped([], "")

    async def _scan_all(self) -> None:
        """Index every entry file by its header (shards scanned in parallel)."""
        files, ledger = self._files, self._ledger
        shards = await self._disk.run(files.dir.shards)
        scan = partial(scan_shard, files.dir, token=files.token, times=FileTimes(ledger.clock()))
        scans = await asyncio.gather(*(self._disk.run(scan, shard) for shard in shards))
        ledger.counts["corrupt"] += sum(s.damaged for s in scans)
        ledger.index.load(entry for s in scans for entry in s.found)

    def _read_index(self) -> Listing | None:
        try:
            return read_index(str(self._files.root), self._ledger.clock())
        except UnsafeEntry as exc:
            self._files.dir.ignore(str(exc))
            return None

    def _load(self, listing: Listing) -> None:
        """Index what the index file lists, in its LRU order; what it lists that this cache does
        not write is reported once the keys are checked too (:meth:`_report_dropped`)."""
        repeats = self._ledger.index.load(listing.entries, lru_ordered=True)
        if repeats:
            listing.dropped.add(f"key {repeats[0].key} is listed more than once", len(repeats))
        self._dropped = listing.dropped

    def _report_dropped(self, foreign: list[Entry], why: str) -> None:
        """Drop the entries listed under keys that are not chunk keys, then report all that was
        dropped: once per open (from :meth:`stop` if the reconciliation never got this far)."""
        index = self._ledger.index
        for entry in foreign:
            if index.get(entry.key) is entry:
                index.remove(entry.key)
        dropped, self._dropped = self._dropped, None
        if dropped is not None and foreign:
            dropped.add(why, len(foreign))
        if dropped is not None and dropped.count:
            log.warning("cache %s: %s", self._name, dropped.describe(self._files.root / INDEX_FILE))

    async def _reconcile(self, loaded: list[Entry]) -> None:
        """After a start from the index file (``loaded``: its entries): bring the index in
        line with the directory, one shard at a time (files other processes added or removed
        since; only new files' headers are read), then write a fresh index file.  An entry
        replaced or removed meanwhile, or a key put or deleted since open, is not this scan's
        to judge (its file may be one the scan saw before a delete).  The entries are grouped by
        shard here, on the executor, not in :meth:`restore`: ~0.4 s of a 10^6-entry restart; and
        first, those listed under a key that is not a chunk key are dropped and reported."""
        times = FileTimes(self._ledger.clock())
        try:
            by_shard, foreign, why = await self._disk.run(by_shard_of, loaded)
            self._report_dropped(foreign, why)
            for shard in sorted(set(await self._disk.run(self._files.dir.shards)) | set(by_shard)):
                await self._reconcile_shard(shard, by_shard.get(shard, []), times)
            await self._disk.remove_victims(self._ledger.trim())
        except (OSError, UnsafeEntry) as exc:
            log.warning("cache %s: reconciling %s with its index file stopped: %s", self._name, self._files.root, exc)
            return
        finally:
            self._touched = None
        await self.save()

    async def _reconcile_shard(self, shard: str, known: list[Entry], times: FileTimes) -> None:
        """Drop the entries of ``known`` whose files are gone, index the files of others."""
        files, ledger = self._files, self._ledger
        scan = await self._disk.run(scan_shard, files.dir, shard, token=files.token, times=times, known={e.key for e in known})
        ledger.counts["corrupt"] += scan.damaged
        for entry in known:
            if entry.key not in scan.names and ledger.index.get(entry.key) is entry:
                ledger.index.remove(entry.key)  # gone since the index file was written
        for entry in scan.found:
            if not ledger.knows(entry.key) and entry.key not in (self._touched or ()):
                ledger.index.add(entry)  # another process's

    async def save(self) -> None:
        """Write the index file (what a restart loads); a failure is logged, never raised.
        One write at a time, in order: a write whose caller was cancelled (a reconciliation
        stopped by aclose) still runs on the pool, and must not land after a newer one."""
        if self._saving is not None:
            await asyncio.wait([self._saving])
        files = self._files
        self._saving = asyncio.wrap_future(
            self._disk.submit(write_index, str(files.root), self._ledger.written(), self._ledger.clock(), files.token)
        )
        try:
            await asyncio.shield(self._saving)
        except (OSError, UnsafeEntry) as exc:
            log.warning("cache %s: cannot write %s/%s: %s", self._name, files.root, INDEX_FILE, exc)
