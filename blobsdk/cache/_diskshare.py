"""Entries another process wrote into a shared disk-cache directory since this cache opened
(blobsdk/cache/disk.py): found on a read, not only at the next open.

A cache knows the files in its index: what it found when it opened (and reconciled), and what
it put since.  A process sharing the directory (a DataLoader's other workers, each with its
own client) writes files this index does not list.  So on a read that misses the index, for a
key this cache is not filling itself, the key's file is looked for on the cache's thread pool:
absent, it is one failed open there (a miss as before); present, it is read and verified as
any hit is (the header's checksum, its size, the payload's xxh3-64, the caller's checksum),
then adopted into the index: its size and tenant from the file, its age from its mtime, most
recently used, counted toward capacity (then trimmed to it, as a put would be).  The file is
untrusted input: a damaged one is deleted and counted ``corrupt``, a symlink (or a shard
directory that is one) is never followed, counted in ``errors`` and logged once; each is a miss.

``contains`` stays the index's answer: it is a synchronous call on the event loop, which never
waits on a disk.  ``find`` (what a deep prefetch asks before it fetches) also looks for the
file, and adopts it by its header alone, as the reconciling scan does (checksum, key, size, and
the caller's checksum against the one the header records): its payload is verified when it is
read.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from ..errors import ClientClosed
from ..runtime.rootdir import UnsafeEntry
from ._diskfiles import DiskFiles, with_file
from ._diskscan import FileTimes, inspect
from ._entryfile import Damaged, read_header
from ._index import Index
from ._payloadfile import FileIdentity, VerifiedFiles
from .base import validate_key
from .policy import Entry, PolicyChain, Victims

Found = tuple[bytearray, FileIdentity, Entry]
T = TypeVar("T")


class SharedFiles(DiskFiles):
    """Adopting another process's file on an index miss (module docstring); the rest of the
    cache is :class:`~blobsdk.cache.disk.DiskCache`, which sets these attributes."""

    _index: Index
    _fills: Mapping[str, object]
    _chain: PolicyChain
    _counts: dict[str, int]
    _capacity: int
    _clock: Callable[[], float]
    _state: str
    _verified: VerifiedFiles | None
    _io: Callable[..., Coroutine[Any, Any, Any]]
    _hit: Callable[[Entry], None]
    _remove_victims: Callable[[Victims], Coroutine[Any, Any, None]]
    _unlink_quietly: Callable[[str], Coroutine[Any, Any, bool]]

    async def find(self, key: str, *, checksum: int | None = None) -> bool:
        """Whether the cache holds ``key`` (with ``checksum``, if given): :meth:`contains`, or
        else a file another process sharing the directory wrote, whose header checks out; that
        one is indexed (module docstring).  Counts no hit nor miss."""
        key = validate_key(key)
        if key in self._index:
            return key not in self._fills
        if self._state != "open":
            raise ClientClosed(f"cache {self._name} is {self._state}: use async with")
        entry = await self._look_for(self._read_foreign_header, key, checksum)
        return entry is not None and await self._index_found(entry) and key not in self._fills

    async def _adopt(self, key: str, checksum: int | None) -> bytearray | None:
        """The payload of ``key``'s file if another process wrote a sound one (now indexed),
        else None; counts the hit or the miss."""
        found = None if key in self._index or key in self._fills else await self._look_for(self._read_foreign, key, checksum)
        if found is None or not await self._index_found(found[2]):
            self._counts["misses"] += 1
            return None
        data, ident, entry = found
        self._hit(entry)
        if self._verified is not None:
            self._verified.record(key, ident, len(self._index))
        return data

    async def _index_found(self, entry: Entry) -> bool:
        """Index another process's entry, unless this cache put or adopted the key meanwhile
        (then that entry stands), and trim; False if it is past the TTL (its file removed)."""
        if entry.key in self._index or entry.key in self._fills:
            return True
        if self._chain.expired(entry, self._clock()):
            await self._unlink_quietly(entry.key)  # as a read of an indexed entry would
            return False
        self._index.add(entry)
        await self._remove_victims(self._chain.trim(self._index, self._capacity, self._clock()))
        return True

    async def _look_for(self, read: Callable[[str, int | None, FileTimes], T | None], key: str, checksum: int | None) -> T | None:
        """``read(key, checksum, times)`` on the pool; None if there is no such file or it is
        unsound (counted)."""
        try:
            found: T | None = await self._io(read, key, checksum, FileTimes(self._clock()))
        except Damaged:
            self._counts["corrupt"] += 1
        except UnsafeEntry as exc:  # a symlink where the file or its shard belongs: never read
            self._dir.ignore(str(exc))
            self._counts["errors"] += 1
        except OSError:
            self._counts["errors"] += 1
        else:
            return found
        return None

    def _read_foreign(self, key: str, checksum: int | None, times: FileTimes) -> Found | None:
        """Blocking: the payload, identity and entry of ``key``'s file, None if there is none;
        Damaged (the file deleted) if it fails a check."""
        try:
            return with_file(self._dir, key, lambda fd, key: self._read_found(fd, key, checksum, times))
        except FileNotFoundError:  # no such file, or no shard directory: the common miss
            return None

    def _read_foreign_header(self, key: str, checksum: int | None, times: FileTimes) -> Entry | None:
        """Blocking: the entry of ``key``'s file by its header, None if there is none; Damaged
        (the file deleted) if the header fails a check or records another checksum."""
        try:
            return with_file(self._dir, key, lambda fd, key: _inspect(fd, key, checksum, times))
        except FileNotFoundError:
            return None

    def _read_found(self, fd: int, key: str, checksum: int | None, times: FileTimes) -> Found:
        entry = inspect(fd, key, times)  # the tenant and the age, from the header and the mtime
        data, ident = self._read_file(fd, key, checksum)  # every check a hit makes, the size too
        return data, ident, entry


def _inspect(fd: int, key: str, checksum: int | None, times: FileTimes) -> Entry:
    st, head = read_header(fd, key)
    if checksum is not None and head.checksum != checksum:
        raise Damaged(f"{key}: holds other bytes than the caller expects")
    return Entry(key, head.length, times(st.st_mtime), times(max(st.st_atime, st.st_mtime)), head.tenant)
