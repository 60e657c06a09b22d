"""Scanning the disk cache's shard directories (blobsdk/cache/_disk.py): blocking, run on the
cache's thread pool.  A full scan reads every entry's header; a reconciling scan (after the
index came from the index file, blobsdk/cache/_indexfile.py) lists the names and reads the
headers of only the files the index does not know."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TypeVar

from ..runtime import TMP_SUFFIX, RootDir, UnsafeEntry, open_regular, remove_if_dead, unlink_if_same
from ._entryfile import Damaged, read_header
from .policy import Entry

T = TypeVar("T")


class FileTimes:
    """Maps file times (wall clock) to the engine's clock by their age."""

    def __init__(self, now: float) -> None:
        self.now, self.wall = now, time.time()

    def __call__(self, file_time: float) -> float:
        return self.now - max(0.0, self.wall - file_time)


@dataclass
class ShardScan:
    """What one shard holds: the entries read (every file's but the known ones), the names
    of every entry file, and how many damaged files were deleted."""

    found: list[Entry] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    damaged: int = 0


def scan_shard(root: RootDir, shard: str, *, token: str, times: FileTimes, known: Collection[str] = ()) -> ShardScan:
    """Scan one shard directory, reading the header of each entry file not in ``known``;
    sweeps the temp files of other writers that died (their lock is free)."""
    try:
        dir_fd = root.open_shard(shard)
    except FileNotFoundError:  # removed since the listing
        return ShardScan()
    except UnsafeEntry as exc:  # a symlink since the listing
        root.ignore(str(exc))
        return ShardScan()
    try:
        return _scan_entries(root, shard, dir_fd, token, times, known)
    finally:
        os.close(dir_fd)


def _scan_entries(root: RootDir, shard: str, dir_fd: int, token: str, times: FileTimes, known: Collection[str]) -> ShardScan:
    scan = ShardScan()
    for dirent in root.files(shard, dir_fd):
        name = dirent.name
        if name.endswith(TMP_SUFFIX):
            if f".{token}-" not in name:
                remove_if_dead(dir_fd, name)
        elif name.startswith(shard):
            scan.names.add(name)
            if name in known:
                continue
            try:
                scan.found.append(with_entry(dir_fd, root.entry_path(shard, name), name, lambda fd, key: inspect(fd, key, times)))
            except Damaged:
                scan.damaged += 1
                scan.names.discard(name)
            except FileNotFoundError:  # deleted while we scan
                scan.names.discard(name)
            except UnsafeEntry as exc:  # swapped for a symlink while we scan
                root.ignore(str(exc))
                scan.names.discard(name)
    return scan


def with_entry(dir_fd: int, path: str, key: str, fn: Callable[[int, str], T]) -> T:
    """``fn(fd, key)`` on file ``key`` of the shard open as ``dir_fd`` (``path`` names it); a
    file it finds damaged is deleted."""
    fd = open_regular(dir_fd, key, path)  # once open, an unlink cannot hurt us
    try:
        return fn(fd, key)
    except Damaged:
        unlink_if_same(dir_fd, key, fd)
        raise
    finally:
        os.close(fd)


def inspect(fd: int, key: str, times: FileTimes) -> Entry:
    """The entry of one file: LRU seeded from its atime, age from its mtime (the fill);
    its payload is verified when it is read."""
    st, head = read_header(fd, key)
    return Entry(key, head.length, times(st.st_mtime), times(max(st.st_atime, st.st_mtime)), head.tenant)
