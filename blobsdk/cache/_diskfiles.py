"""The disk cache's file operations (blobsdk/cache/_disk.py), blocking, run on its thread pool:
a fill's write and rename, a verified read, an unlink, the FORMAT check.

They are the methods of :class:`DiskFiles`, one object per cache that every part of it holds
(the cache, its reload, its shared files): a test injects a fault by replacing one of them on
that object.  Warnings go to the ``blobsdk.cache.disk`` logger: one cache, one logger.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

import xxhash

from ..chunks import is_hex32
from ..runtime import RootDir, UnsafeEntry, create_temp, marker_text, misnamed, uninitialized, unlink_at
from ._diskscan import with_entry
from ._entryfile import Damaged as _Damaged
from ._entryfile import Expected
from ._entryfile import encode_header as _encode_header
from ._entryfile import read_header as _read_header
from ._indexfile import INDEX_FILE
from ._payloadfile import FileIdentity, identity, refresh_atime
from .base import Buffer

T = TypeVar("T")

_KIND = "disk-cache"
_LAYOUT = 1  # the layout (blobsdk/cache/_disk.py, the FORMAT marker); files carry their own version too (_entryfile.py)

log = logging.getLogger("blobsdk.cache.disk")


class DiskFiles:
    """The blocking half of a disk cache: the files under ``root_dir`` (module docstring).
    ``token`` marks this cache's temp files, so that no sweep takes them; ``name`` is the
    cache's, for the log."""

    def __init__(self, root_dir: RootDir, *, name: str, token: str) -> None:
        self.dir = root_dir
        self.root: Path = root_dir.path
        self.name = name
        self.token = token

    def store(self, key: str, tenant: str, payload: memoryview, doomed: list[str]) -> None:
        for victim in doomed:  # first, so the space they held is free for this file
            self.remove_quietly(victim)  # an undeletable victim must not fail this put
        header = _encode_header(key, tenant, payload)
        with self.dir.shard(shard_of(key), create=True) as dir_fd:
            fd, temp = create_temp(dir_fd, key, self.token)  # locked until renamed or removed
            try:
                self.write_parts(fd, [header, payload])
                os.replace(temp, key, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # no fsync: a crash may lose it, never tear it
            except BaseException:
                unlink_at(dir_fd, temp)
                raise
            finally:
                os.close(fd)

    def remove(self, key: str) -> bool:
        """Unlink ``key``'s file (a symlink there goes, never its target); True if it was there.
        A key that is not a chunk key (an index file's forgery, not yet dropped) names no file:
        nothing is removed."""
        if not is_hex32(key):
            return False
        try:
            with self.dir.shard(shard_of(key)) as dir_fd:
                return unlink_at(dir_fd, key)
        except FileNotFoundError:  # no shard directory
            return False

    def remove_quietly(self, key: str) -> None:
        try:
            self.remove(key)
        except UnsafeEntry as exc:
            self.dir.ignore(str(exc))
        except OSError:
            pass

    def remove_all(self, keys: list[str]) -> int:
        """Remove every key's file, whatever fails; how many could not be removed."""
        failed = 0
        for key in keys:
            try:
                self.remove(key)
            except UnsafeEntry as exc:
                self.dir.ignore(str(exc))
                failed += 1
            except OSError:
                failed += 1
        return failed

    def check_format(self) -> None:
        """Open, adopt or discard by ``root/FORMAT`` (module docstring); IncompatibleFormat
        for a directory that is not a disk cache."""
        version = self.dir.marked_version(_KIND)
        if version == _LAYOUT:
            return
        if version is not None:
            removed = self.dir.clear()
            with suppress(FileNotFoundError):
                os.unlink(self.root / INDEX_FILE)  # it names the entries just discarded
            log.warning(
                "cache %s: %s is in format %d, this build uses format %d: discarded its %d files",
                *(self.name, self.root, version, _LAYOUT, removed),
            )
        elif self.dir.shards():
            log.info(
                "cache %s: %s has no FORMAT (written before markers): marked as format %d, its entries checked by their headers",
                *(self.name, self.root, _LAYOUT),
            )
        self.dir.mark(marker_text(_KIND, _LAYOUT), self.token)

    def write_parts(self, fd: int, parts: list[Buffer]) -> None:
        for part in parts:
            view = memoryview(part).cast("B")
            while view:  # a write may be short
                view = view[os.write(fd, view) :]

    def read(self, key: str, expected: Expected) -> tuple[bytearray, FileIdentity]:
        return with_file(self.dir, key, lambda fd, key: self.read_file(fd, key, expected))

    def read_file(self, fd: int, key: str, expected: Expected) -> tuple[bytearray, FileIdentity]:
        st, head = _read_header(fd, key)
        expected.check(head, key)  # before the allocation: a header may claim any length its (sparse) file has
        payload = uninitialized(head.length)  # filled whole, or discarded: no zeroing pass
        filled = os.preadv(fd, [payload], head.offset)  # straight into the buffer: no extra copy
        if filled != head.length or xxhash.xxh3_64_intdigest(payload) != head.checksum:
            raise _Damaged(f"{key}: payload checksum mismatch")
        refresh_atime(fd, st)
        return payload, identity(st)


# --- blocking helpers --------------------------------------------------------------------


def shard_of(key: str) -> str:
    """The shard directory of ``key``'s file; UnsafeEntry unless ``key`` is a chunk key, the
    only name a file of the cache has: a key from anywhere (an index file another process
    wrote) never becomes a path."""
    if not is_hex32(key):
        raise UnsafeEntry(misnamed(key, "a cache entry's file"))
    return key[:2]


def with_file(root: RootDir, key: str, fn: Callable[[int, str], T]) -> T:
    """``fn(fd, key)`` on ``key``'s file; a file it finds damaged is deleted."""
    shard = shard_of(key)
    with root.shard(shard) as dir_fd:
        return with_entry(dir_fd, root.entry_path(shard, key), key, fn)


def space_deficit(root: Path, incoming: int, min_free_ratio: float) -> int:
    st = os.statvfs(root)
    want_free = min_free_ratio * st.f_blocks * st.f_frsize
    free_after = st.f_bavail * st.f_frsize - incoming
    return max(0, math.ceil(want_free - free_after))
