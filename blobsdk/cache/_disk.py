"""The on-disk chunk cache (the SDK's L2 and the L3 flash node): one file per chunk.

Layout::

    root/FORMAT                                 "blobsdk disk-cache format 1"
    root/<key[:2]>/<key>                        one entry: header, then the payload
    root/<key[:2]>/<key>.<token>-<random>.tmp   a fill in progress

Names come only from validated keys, and no entry inside ``root`` is followed if it is a
symlink (blobsdk/runtime/rootdir.py), so nothing outside ``root`` is ever read, created or
deleted.  The cache never raises for such an entry: a shard directory or file that is a
symlink, or not what the layout puts there, is ignored with one logged warning naming it
and counted in ``errors``; a fill there fails (``put`` returns False), a read is a miss, a
delete or eviction removes nothing through it, and opening skips it.  A file
starts with a header (blobsdk/cache/_entryfile.py: magic, version, lengths, xxh3-64 of the
payload, xxh3-64 of the header and key, tenant); every read checks both checksums and the size, so a
torn, truncated, bit-flipped or misnamed file is deleted, counted as ``corrupt`` and read
as a miss, never returned.

Fills are all or nothing without fsync: a temp file in the shard directory, renamed over
the final name.  A crash may lose entries (fine for a cache) but never exposes a partial
one, and the checksums catch whatever it tore.  A writer holds a lock on its temp file until
the rename; opening sweeps the temp files whose lock it can take (their writer died), never a
live writer's in any process, however old.

``open`` checks ``root/FORMAT`` first.  Format 1 opens.  A root without a marker gets one;
if it holds entries (a cache written before markers) they are kept, since format 1 is what
every build wrote and each file's header (magic, version, checksums) is checked before it is
indexed anyway.  A marker of this kind in another version (a newer or older build): the
entries are discarded (the regular files in the shard directories, dead writers' temp files)
with a logged warning, and the marker rewritten; a cache is disposable, a misread is not.  A
marker of another kind (a local block store) or a FORMAT that is not a marker:
IncompatibleFormat, nothing touched.

``open`` loads the index from ``root/INDEX`` (blobsdk/cache/_indexfile.py), written at close
and after each reconciliation: a million entries in about a second.  Then, in the background,
it reconciles the index with the directory shard by shard (files another process added or
removed since; only new files' headers are read) and writes a fresh index file.  Any process
sharing the directory may have written that file: a bad entry is dropped (its key's digits as
the reconciliation starts), with one warning per open however many.  Without a
usable index file, ``open`` rebuilds the index from every file's header (one small read each,
shards scanned in parallel; ~80 s per million files on the dev machine): it names the tenant
that quotas need and catches truncation early.  Either way, payloads are verified on each
read.  LRU order is seeded from atimes (reads refresh them, at most once a minute), TTL and
hold from mtimes (the fill); pins are not persisted.  Then the cache is trimmed to its
capacity.  Processes may share a directory and delete or replace files under
each other: the worst case is a miss (a vanished file drops our index entry), never wrong
bytes; a file another process adds is found by the first read that misses the index
(blobsdk/cache/_diskshare.py).  All disk access runs on the cache's own thread pool, never
on the event loop.

The cache is made of explicit parts, each given what it uses by its constructor: what it holds
in memory (the index, the policies, the fills, the counters: ``Ledger``) and its thread pool
over its files (``DiskPool``), both in blobsdk/cache/_diskstate.py; the blocking file
operations (blobsdk/cache/_diskfiles.py); the adoption of another process's files
(blobsdk/cache/_diskshare.py); the restart path, index file and reconciliation
(blobsdk/cache/_diskreload.py).

With ``remember_verified`` (the L3 node) the cache remembers which file each key's last
verified read saw (in memory only: after a restart every file is verified again), and
``open_verified`` hands that file out open, its payload unread, for a zero-copy send
(blobsdk/cache/_payloadfile.py: why, and why a file unchanged since is safe).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Self

from ..errors import ClientClosed, Unavailable
from ..runtime import AsyncResource, RootDir, UnsafeEntry
from ._diskfiles import DiskFiles, space_deficit, with_file
from ._diskreload import Reload
from ._diskshare import SharedFiles
from ._diskstate import DiskPool, Fill, Ledger
from ._entryfile import Damaged as _Damaged
from ._entryfile import Expected
from ._payloadfile import PayloadFile, open_payload
from .base import DEFAULT_TENANT, Buffer, validate_key
from .policy import Entry, PolicyChain, validate_tenant

log = logging.getLogger("blobsdk.cache.disk")  # the name users configure, kept when the module went private


class DiskCache(AsyncResource):
    """A :class:`~blobsdk.cache.base.ChunkCache` over one directory (module docstring).

    ``capacity_bytes`` counts payload bytes (a file adds 32 bytes plus the tenant name);
    ``min_free_ratio`` of the file system is kept free (``os.statvfs`` on each put).
    ``threads`` bounds concurrent disk operations.  Use ``async with`` (or :meth:`open`
    and :meth:`aclose`).  ``put`` never raises for a disk problem: it returns False and
    counts ``errors``; the caller must not change ``data`` until ``put`` returns.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        capacity_bytes: int,
        min_free_ratio: float = 0.05,
        ttl_seconds: float | None = None,
        hold_seconds: float = 0.0,
        quotas: Mapping[str, int] | None = None,
        threads: int = 4,
        name: str = "disk",
        clock: Callable[[], float] = time.monotonic,
        remember_verified: bool = False,
    ) -> None:
        if capacity_bytes < 0 or not 0 <= min_free_ratio < 1 or threads < 1:
            raise ValueError(f"bad DiskCache settings: {capacity_bytes=} {min_free_ratio=} {threads=}")
        self._root = Path(os.path.abspath(root))
        self._min_free = min_free_ratio
        self._name = name
        self._state = "new"
        token = os.urandom(4).hex()  # marks our temp files: a sweep never takes them
        self._files = DiskFiles(RootDir(self._root, label=f"cache {name}", log=log, durable=False), name=name, token=token)
        chain = PolicyChain(ttl_seconds=ttl_seconds, hold_seconds=hold_seconds, quotas=quotas)
        self._ledger = Ledger(chain, capacity=capacity_bytes, clock=clock, remember_verified=remember_verified)
        self._disk = DiskPool(self._files, self._ledger.counts, threads=threads)
        self._shared = SharedFiles(self._ledger, self._disk)
        self._reload = Reload(self._ledger, self._disk)

    @property
    def name(self) -> str:
        return self._name

    @property
    def root(self) -> Path:
        return self._root

    @property
    def capacity_bytes(self) -> int:
        return self._ledger.capacity

    @property
    def used_bytes(self) -> int:
        return self._ledger.index.used

    async def open(self) -> Self:
        """Create ``root`` if needed, check its FORMAT (module docstring), sweep dead
        writers' temp files and rebuild the index."""
        if self._state != "new":
            return self
        try:
            await self._disk.run(self._root.mkdir, parents=True, exist_ok=True)
            await self._disk.run(self._files.check_format)
            listing = await self._reload.restore()
            await self._disk.remove_victims(self._ledger.trim())
        except UnsafeEntry as exc:
            raise Unavailable(f"cache {self._name} cannot open {self._root}: refused {exc}") from exc
        except OSError as exc:
            raise Unavailable(f"cache {self._name} cannot open {self._root}: {exc}") from exc
        self._state = "open"
        if listing is not None:  # what the index file named, before any put
            self._reload.reconcile_in_background(listing)
        return self

    async def get(self, key: str, *, checksum: int | None = None, length: int | None = None) -> bytearray | None:
        """The payload for ``key`` (a new bytearray the caller owns), read and verified on
        the executor, or None.  With ``checksum`` (an xxh3-64 the caller expects) a copy
        whose recorded checksum differs counts as corrupt too: one hash checks both.  With
        ``length`` (the payload's, as the caller knows it) so does a copy whose header records
        another, before anything is allocated for it: a file in a shared directory may claim
        any length its (sparse) file has."""
        expected = Expected(checksum, length)
        entry = await self._readable(validate_key(key))
        if entry is None:  # another process sharing root may have written it since we opened
            return await self._shared.adopt(key, expected)
        ledger = self._ledger
        try:
            data, ident = await self._disk.run(self._files.read, key, expected)
        except _Damaged:
            ledger.lost(entry, "corrupt")
            return None
        except FileNotFoundError:  # deleted or evicted by another process sharing root
            ledger.lost(entry)
            return None
        except UnsafeEntry as exc:  # a symlink where the entry or its shard belongs: never read
            self._files.dir.ignore(str(exc))
            ledger.lost(entry, "errors")
            return None
        except OSError:
            ledger.lost(entry, "errors")
            return None
        if entry.size != len(data) and ledger.index.get(key) is entry:
            ledger.index.resize(entry, len(data))  # the index file said otherwise
        ledger.hit(entry)
        ledger.saw(key, ident)
        return data

    async def find(self, key: str, *, checksum: int | None = None, length: int | None = None) -> bool:
        """Whether the cache holds ``key`` (with ``checksum`` and ``length``, if given, as
        :meth:`get`): :meth:`contains`, or else a file another process sharing the directory
        wrote, whose header checks out; that one is indexed (blobsdk/cache/_diskshare.py).
        Counts no hit nor miss."""
        key = validate_key(key)
        if key in self._ledger.index:
            return key not in self._ledger.fills
        self._check_open()
        return await self._shared.find(key, Expected(checksum, length))

    async def open_verified(self, key: str) -> PayloadFile | None:
        """The entry's file, open, if an earlier :meth:`get` of this cache verified that
        very file (``remember_verified``; blobsdk/cache/_payloadfile.py); else None and the
        caller reads it with :meth:`get` (absent, not yet verified, or replaced since)."""
        entry = await self._readable(validate_key(key))
        verified = self._ledger.verified
        known = None if verified is None or entry is None else verified.get(key)
        if entry is None or known is None:
            return None
        try:
            opened: PayloadFile | None = await self._disk.run(with_file, self._files.dir, key, partial(open_payload, known=known))
        except (_Damaged, OSError):  # the get that follows counts it
            return None
        if opened is not None:
            self._ledger.hit(entry)
        return opened

    def forget_verified(self, key: str) -> None:
        """Make the next read of ``key`` verify its file again (:meth:`get`)."""
        self._ledger.forget_verified(validate_key(key))

    async def put(self, key: str, data: Buffer, *, tenant: str = DEFAULT_TENANT, pin_seconds: float = 0.0) -> bool:
        """Store a copy of ``data``: True once it is readable, False if it could not be
        admitted or written (then ``key`` is gone).  QuotaExceeded: see ChunkCache."""
        key, tenant = validate_key(key), validate_tenant(tenant)
        view = memoryview(data).cast("B")
        ledger = self._ledger
        now = ledger.clock()
        entry = Entry(key, view.nbytes, now, now, tenant, math.inf)  # unevictable until written
        deficit = await self._space_deficit_for(entry)
        # From here to the fill's start nothing awaits: the quota is checked on the index the
        # admission then sees, and a put refused for it changes nothing (another tenant's copy
        # of the key stays).
        ledger.chain.check_quota(ledger.index, entry, now)
        replaced = self._forget(key) is not None
        victims = None if deficit is None else ledger.chain.admit(ledger.index, entry, ledger.capacity, now, deficit)
        if victims is None:
            if replaced:  # a put that fails must leave no older bytes
                await self._disk.unlink_quietly(key)
            return False
        doomed: list[str] = [key] if replaced else []  # unlinked first by the fill's own job
        doomed += [e.key for _, e in victims]
        return await self._fill(entry, now + pin_seconds if pin_seconds > 0 else 0.0, view, doomed)

    def pin(self, key: str, seconds: float) -> bool:
        """Protect a present entry from eviction for ``seconds`` more; False if absent."""
        ledger = self._ledger
        entry = ledger.index.get(validate_key(key))
        if entry is None:
            return False
        fill = ledger.fills.get(key)
        holder = fill if fill is not None and fill.entry is entry else entry
        holder.pin_until = max(holder.pin_until, ledger.clock() + seconds)
        return True

    async def reconciled(self) -> None:
        """Wait until the index is in line with the directory: at once after a start that read
        every header, else once the background reconciliation (module docstring) is done."""
        await self._reload.reconciled()

    def tenant_usage(self) -> dict[str, int]:
        """Bytes stored (or being stored) per tenant."""
        return dict(self._ledger.index.tenant_bytes)

    async def delete(self, key: str) -> bool:
        """Remove ``key`` (also a file another process put there); True if there was one."""
        key = validate_key(key)
        entry = self._forget(key)
        unlinked = await self._disk.unlink_quietly(key)
        return entry is not None or unlinked

    def contains(self, key: str) -> bool:
        return self._ledger.holds(validate_key(key))

    def stats(self) -> dict[str, int | float]:
        return self._ledger.stats()

    async def aclose(self) -> None:
        """Stop reconciling, write the index file, wait for running disk operations, then stop
        the thread pool.  Idempotent."""
        if self._state == "closed":
            return
        await self._reload.stop()
        if self._state == "open":
            await self._reload.save()
        self._state = "closed"
        await self._disk.aclose()

    async def _start(self) -> None:
        await self.open()  # a failed one is closed (AsyncResource): the pool never outlives it

    # --- internals, on the event loop -------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise ClientClosed(f"cache {self._name} is {self._state}: use async with")

    def _forget(self, key: str) -> Entry | None:
        """Drop ``key``'s entry and any fill of it from the index (a put or a delete); the
        entry there was, whose file the caller removes."""
        ledger = self._ledger
        ledger.fills.pop(key, None)
        ledger.forget_verified(key)
        self._reload.touch(key)
        return ledger.index.remove(key)

    async def _readable(self, key: str) -> Entry | None:
        """The entry to read for ``key``: None if absent, being written or expired."""
        self._check_open()
        ledger = self._ledger
        entry = ledger.index.get(key)
        if entry is None or key in ledger.fills:
            return None
        if ledger.chain.expired(entry, ledger.clock()):
            ledger.chain.expire(ledger.index, entry)
            await self._disk.unlink_quietly(key)
            return None
        return entry

    async def _space_deficit_for(self, entry: Entry) -> int | None:
        """Bytes to evict for the file system's sake before ``entry`` is written (see
        :meth:`_space_deficit`); ClientClosed unless the cache is open."""
        self._check_open()
        return await self._space_deficit(entry.size) if entry.size <= self._ledger.capacity else 0

    async def _space_deficit(self, incoming: int) -> int | None:
        """Bytes to evict to keep ``min_free_ratio`` free after this put and the fills in
        flight; None if the file system cannot be asked."""
        if self._min_free <= 0:
            return 0
        in_flight = sum(f.entry.size for f in self._ledger.fills.values())
        try:
            return await self._disk.run(space_deficit, self._root, incoming + in_flight, self._min_free)
        except OSError:
            self._ledger.counts["errors"] += 1
            return None

    async def _fill(self, entry: Entry, pin_until: float, view: memoryview, doomed: list[str]) -> bool:
        fill = Fill(entry, pin_until)
        self._ledger.index.add(entry)
        self._ledger.fills[entry.key] = fill
        job = asyncio.wrap_future(self._disk.submit(self._files.store, entry.key, entry.tenant, view, doomed))
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(partial(self._settle, fill))  # the write still finishes
            raise
        except Exception:  # noqa: BLE001 - _settle reads the outcome from the job
            pass
        return self._settle(fill, job)

    def _settle(self, fill: Fill, job: asyncio.Future[None]) -> bool:
        """Publish or drop a finished fill in the index; True if its file was written."""
        ledger, entry, key = self._ledger, fill.entry, fill.entry.key
        if ledger.fills.get(key) is fill:
            del ledger.fills[key]
        ours = ledger.index.get(key) is entry
        exc = job.exception()
        if exc is None:
            entry.pin_until = fill.pin_until
            ledger.counts["puts"] += 1
            if not ours and key not in ledger.index and not self._disk.closed:
                self._disk.submit(self._files.remove_quietly, key)  # deleted while written: no orphan file
            return True
        if ours:
            ledger.index.remove(key)
        if not isinstance(exc, OSError):
            raise exc
        if isinstance(exc, UnsafeEntry):
            self._files.dir.ignore(str(exc))
        ledger.counts["errors"] += 1
        return False
