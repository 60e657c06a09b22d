"""What the parts of a disk cache (blobsdk/cache/_disk.py) share, as two explicit objects the
cache makes and hands to each part by its constructor:

- :class:`Ledger`, what the cache holds, in memory: the index and its policy chain, the
  capacity and the clock, the fills in flight, the files verified reads saw, the counters.
  Only the event loop touches it, so it needs no lock.
- :class:`DiskPool`, the cache's thread pool over its files (blobsdk/cache/_diskfiles.py):
  every disk operation runs there, never on the event loop, and none starts once the cache is
  closed; removals whose failures are counted, never raised, are its too.

The cache itself (``put``, ``get``, ``delete``...), the adoption of another process's files
(blobsdk/cache/_diskshare.py) and the restart (blobsdk/cache/_diskreload.py) each hold these
two and nothing of one another's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ClientClosed
from ..runtime import Executor, UnsafeEntry
from ._diskfiles import DiskFiles
from ._payloadfile import FileIdentity, VerifiedFiles
from .policy import Entry, PolicyChain, Victims

T = TypeVar("T")

COUNTERS = ("hits", "misses", "puts", "corrupt", "errors")


@dataclass(slots=True)
class Fill:
    """A put being written: indexed (concurrent puts count its bytes), not yet readable
    nor evictable (pinned to infinity); ``pin_until`` is the pin it gets once written."""

    entry: Entry
    pin_until: float


class Ledger:
    """What a disk cache holds, in memory (module docstring).  ``counts`` are the counters
    of ``stats()``; ``verified`` is None unless the cache remembers verified files."""

    __slots__ = ("capacity", "chain", "clock", "counts", "fills", "index", "verified")

    def __init__(self, chain: PolicyChain, *, capacity: int, clock: Callable[[], float], remember_verified: bool) -> None:
        self.chain = chain
        self.index = chain.new_index()
        self.capacity = capacity
        self.clock = clock
        self.fills: dict[str, Fill] = {}
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.verified = VerifiedFiles() if remember_verified else None

    def holds(self, key: str) -> bool:
        """Whether ``key`` is indexed and readable (not being written)."""
        return key in self.index and key not in self.fills

    def knows(self, key: str) -> bool:
        """Whether ``key`` is indexed or being written: no other process's file to adopt."""
        return key in self.index or key in self.fills

    def hit(self, entry: Entry) -> None:
        """Count a hit on ``entry``, most recently used now if it is still the key's."""
        if self.index.get(entry.key) is entry:
            self.index.touch(entry, self.clock())
        self.counts["hits"] += 1

    def lost(self, entry: Entry, cause: str | None = None) -> None:
        """Forget an entry whose file is gone or bad (counted as ``cause``): a miss."""
        if cause:
            self.counts[cause] += 1
        self.forget_verified(entry.key)
        if self.index.get(entry.key) is entry:
            self.index.remove(entry.key)
        self.counts["misses"] += 1

    def saw(self, key: str, ident: FileIdentity) -> None:
        """Remember the file a verified read of ``key`` saw (if the cache remembers them)."""
        if self.verified is not None:
            self.verified.record(key, ident, len(self.index))

    def forget_verified(self, key: str) -> None:
        if self.verified is not None:
            self.verified.forget(key)

    def trim(self) -> Victims:
        """Take out of the index what exceeds the capacity now; the caller removes their files."""
        return self.chain.trim(self.index, self.capacity, self.clock())

    def written(self) -> list[Entry]:
        """The indexed entries whose files are written (no fill in flight), in LRU order."""
        return [e for e in self.index.lru.values() if e.key not in self.fills]

    def stats(self) -> dict[str, int | float]:
        return {
            **self.counts,
            "bytes": self.index.used,
            "entries": len(self.index),
            "capacity_bytes": self.capacity,
            **self.chain.stats(),
        }


class DiskPool:
    """A disk cache's thread pool over its ``files`` (module docstring); a failed removal
    is counted in ``counts["errors"]``.  :meth:`aclose` stops it."""

    def __init__(self, files: DiskFiles, counts: dict[str, int], *, threads: int) -> None:
        self.files = files
        self.name = files.name
        self._counts = counts
        self._pool = Executor(threads, thread_name_prefix=f"blobsdk-{files.name}")
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the pool; ClientClosed once the cache is closed."""
        if self._closed:
            raise ClientClosed(f"cache {self.name} is closed")
        return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` on the pool, as a job that runs whoever waits for it (a fill, an
        index write: they finish even if their caller is cancelled)."""
        return self._pool.submit(fn, *args)

    async def remove_victims(self, victims: Victims) -> None:
        """Remove the files of entries a trim took out of the index, in one job that goes on if
        this task is cancelled (aclose stopping a reconciliation): else the rest would stay on
        disk unindexed, over capacity, until the next start's reconciliation."""
        if victims:
            self._counts["errors"] += await asyncio.shield(self.run(self.files.remove_all, [e.key for _, e in victims]))

    async def unlink_quietly(self, key: str) -> bool:
        """Remove ``key``'s file; True if there was one.  A failure is counted (and an
        unsafe entry logged), never raised."""
        try:
            return await self.run(self.files.remove, key)
        except UnsafeEntry as exc:
            self.files.dir.ignore(str(exc))
        except OSError:
            pass
        self._counts["errors"] += 1
        return False

    async def aclose(self) -> None:
        """Refuse new jobs at once, then wait for the running ones and stop the threads."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
