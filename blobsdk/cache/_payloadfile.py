"""A cache entry's payload as an open file, for a zero-copy send (the L3 node's hits).

A DiskCache made with ``remember_verified`` remembers, per key, the identity of the file
(device, inode, mtime, size) whose payload its last :meth:`~blobsdk.cache.DiskCache.get`
read and verified (xxh3-64 against the header).  :meth:`~blobsdk.cache.DiskCache.open_verified`
then hands out that same file, open, its header checked again but its payload not read:
the L3 node sends it with ``sendfile`` from the page cache to the socket (servers/flashsend.py).

Why: serving a hit by reading the payload into new memory and hashing it was 46% of an L3
node's CPU (py-spy: ``preadv`` into a fresh buffer 39%, xxh3 7%), and the node spent 3.0x
the CPU per GB of a trivial HTTP server (``l3_server_cpu_vs_http_server`` in
``python -m benchmarks tiers``); docs/benchmarks.md has the figures after.

What makes trusting a verified file safe: an entry is never written in place (a fill is a
new file renamed over the name), so a file whose identity is unchanged holds the bytes that
were verified, unless the medium itself rots.  A fill or replacement by another process is a
new inode, and so is verified again on its first read.  Rot after the verification is
caught by the client, which verifies every chunk it receives; it then reads the chunk
elsewhere and reports the bad copy (``POST /v1/chunks/{key}/bad``), and the node forgets the
identity and verifies the file again, deleting it if it is damaged.
"""

from __future__ import annotations

import io
import os
import time
from contextlib import suppress
from typing import NamedTuple, Self

from ._entryfile import read_header

ATIME_REFRESH = 60.0  # seconds; bounds the inode writes that persisting the LRU costs
_SLACK = 64  # identities kept beyond twice the live entries (evicted keys age out)


class FileIdentity(NamedTuple):
    dev: int
    ino: int
    mtime_ns: int
    size: int


def identity(st: os.stat_result) -> FileIdentity:
    """What changes if the file is replaced or rewritten (an atime refresh keeps mtime)."""
    return FileIdentity(st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class PayloadFile:
    """An entry's file, open (the caller closes it), and where its payload lies."""

    __slots__ = ("file", "length", "offset")

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.file = io.FileIO(fd, "rb", closefd=True)
        self.offset, self.length = offset, length

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class VerifiedFiles:
    """Key -> identity of the file last verified for it, the most recently recorded last;
    at most twice the live entries (+ slack), the oldest dropped first."""

    def __init__(self) -> None:
        self._files: dict[str, FileIdentity] = {}

    def get(self, key: str) -> FileIdentity | None:
        return self._files.get(key)

    def record(self, key: str, ident: FileIdentity, live_entries: int) -> None:
        self._files.pop(key, None)
        self._files[key] = ident
        while len(self._files) > 2 * live_entries + _SLACK:
            del self._files[next(iter(self._files))]

    def forget(self, key: str) -> None:
        self._files.pop(key, None)

    def __len__(self) -> int:
        return len(self._files)


def open_payload(fd: int, key: str, *, known: FileIdentity) -> PayloadFile | None:
    """A PayloadFile of file ``fd`` (a new fd: the caller closes ``fd``) if it is still the
    file verified as ``known``; None if not.  Damaged if its header is bad."""
    st, head = read_header(fd, key)
    if identity(st) != known:
        return None
    refresh_atime(fd, st)
    return PayloadFile(os.dup(fd), head.offset, head.length)


def refresh_atime(fd: int, st: os.stat_result) -> None:
    """Record a read in the atime (next start-up's LRU seed; works under noatime too)."""
    if time.time() - st.st_atime < ATIME_REFRESH:
        return
    with suppress(OSError):  # e.g. a file of another user: the LRU seed is only a hint
        os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
