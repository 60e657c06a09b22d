"""Entries another process wrote into a shared disk-cache directory since this cache opened
(blobsdk/cache/_disk.py): found on a read, not only at the next open.

A cache knows the files in its index: what it found when it opened (and reconciled), and what
it put since.  A process sharing the directory (a DataLoader's other workers, each with its
own client) writes files this index does not list.  So on a read that misses the index, for a
key this cache is not filling itself, the key's file is looked for on the cache's thread pool:
absent, it is one failed open there (a miss as before); present, it is read and verified as
any hit is (the header's checksum, its size, the payload's xxh3-64, the caller's checksum and
length),
then adopted into the index: its size and tenant from the file, its age from its mtime, most
recently used, counted toward capacity (then trimmed to it, as a put would be).  The file is
untrusted input: a damaged one is deleted and counted ``corrupt``, a symlink (or a shard
directory that is one) is never followed, counted in ``errors`` and logged once; each is a miss.

``contains`` stays the index's answer: it is a synchronous call on the event loop, which never
waits on a disk.  ``find`` (what a deep prefetch asks before it fetches) also looks for the
file, and adopts it by its header alone, as the reconciling scan does (checksum, key, size, and
the caller's checksum and length against the ones the header records): its payload is verified when it is
read.

:class:`SharedFiles` does both for the cache, over the cache's ledger and pool
(blobsdk/cache/_diskstate.py); the cache checks the key, and that it is open, first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..runtime import UnsafeEntry
from ._diskfiles import with_file
from ._diskscan import FileTimes, inspect
from ._diskstate import DiskPool, Ledger
from ._entryfile import Damaged, Expected, read_header
from ._payloadfile import FileIdentity
from .policy import Entry

Found = tuple[bytearray, FileIdentity, Entry]
T = TypeVar("T")


class SharedFiles:
    """Another process's files found on an index miss, and adopted (module docstring)."""

    def __init__(self, ledger: Ledger, disk: DiskPool) -> None:
        self._ledger = ledger
        self._disk = disk
        self._files = disk.files

    async def find(self, key: str, expected: Expected) -> bool:
        """Whether another process wrote ``key``'s file (with what the caller ``expected``) and its
        header checks out; that file is indexed.  For a key the index does not hold."""
        entry = await self._look_for(self._read_header, key, expected)
        return entry is not None and await self._index_found(entry) and key not in self._ledger.fills

    async def adopt(self, key: str, expected: Expected) -> bytearray | None:
        """The payload of ``key``'s file if another process wrote a sound one (now indexed),
        else None; counts the hit or the miss.  For a key the index does not hold readable."""
        ledger = self._ledger
        found = None if ledger.knows(key) else await self._look_for(self._read, key, expected)
        if found is None or not await self._index_found(found[2]):
            ledger.counts["misses"] += 1
            return None
        data, ident, entry = found
        ledger.hit(entry)
        ledger.saw(key, ident)
        return data

    async def _index_found(self, entry: Entry) -> bool:
        """Index another process's entry, unless this cache put or adopted the key meanwhile
        (then that entry stands), and trim; False if it is past the TTL (its file removed)."""
        ledger = self._ledger
        if ledger.knows(entry.key):
            return True
        if ledger.chain.expired(entry, ledger.clock()):
            await self._disk.unlink_quietly(entry.key)  # as a read of an indexed entry would
            return False
        ledger.index.add(entry)
        await self._disk.remove_victims(ledger.trim())
        return True

    async def _look_for(self, read: Callable[[str, Expected, FileTimes], T | None], key: str, expected: Expected) -> T | None:
        """``read(key, expected, times)`` on the pool; None if there is no such file or it is
        unsound (counted)."""
        counts = self._ledger.counts
        try:
            found: T | None = await self._disk.run(read, key, expected, FileTimes(self._ledger.clock()))
        except Damaged:
            counts["corrupt"] += 1
        except UnsafeEntry as exc:  # a symlink where the file or its shard belongs: never read
            self._files.dir.ignore(str(exc))
            counts["errors"] += 1
        except OSError:
            counts["errors"] += 1
        else:
            return found
        return None

    def _read(self, key: str, expected: Expected, times: FileTimes) -> Found | None:
        """Blocking: the payload, identity and entry of ``key``'s file, None if there is none;
        Damaged (the file deleted) if it fails a check."""
        try:
            return with_file(self._files.dir, key, lambda fd, key: self._read_found(fd, key, expected, times))
        except FileNotFoundError:  # no such file, or no shard directory: the common miss
            return None

    def _read_header(self, key: str, expected: Expected, times: FileTimes) -> Entry | None:
        """Blocking: the entry of ``key``'s file by its header, None if there is none; Damaged
        (the file deleted) if the header fails a check or records another checksum or length."""
        try:
            return with_file(self._files.dir, key, lambda fd, key: _inspect(fd, key, expected, times))
        except FileNotFoundError:
            return None

    def _read_found(self, fd: int, key: str, expected: Expected, times: FileTimes) -> Found:
        entry = inspect(fd, key, times)  # the tenant and the age, from the header and the mtime
        data, ident = self._files.read_file(fd, key, expected)  # every check a hit makes, the size too
        return data, ident, entry


def _inspect(fd: int, key: str, expected: Expected, times: FileTimes) -> Entry:
    st, head = read_header(fd, key)
    expected.check(head, key)
    return Entry(key, head.length, times(st.st_mtime), times(max(st.st_atime, st.st_mtime)), head.tenant)
