"""The read-plan cache: an in-process TTL cache in front of any MetadataStore.

Staleness rule: a plan served from the cache is at most ``ttl_seconds`` old, and a plan
whose chunk grants (blobsdk.auth) expire within ``GRANT_MARGIN_S`` is not served at all:
the next read asks the store again, for fresh grants.  This client's
own commits and deletes update the cache at once, so a client always reads its own writes;
another client's write becomes visible here within ``ttl_seconds``.  Missing paths are not
cached, so a blob created elsewhere is visible at once.  Chunk caches cannot be stale at all
(chunk keys name immutable bytes); only plans can.

Late answers: a lookup that left before this client's own commit or delete of the
path may answer after it, with the older version.  Versions only grow per path (even across
deletes), so while any call for a path is in flight the cache keeps the newest version it has
seen of it, and a tombstone (the deleted version) for its own deletes: an answer older than
the newest seen is neither cached nor returned (the newest is, or BlobNotFound after the
tombstone), and a cached plan is never replaced by an older one.  Once nothing for the path
is in flight every new lookup starts after those writes, so the record is dropped (memory is
bounded by the calls in flight).

Every plan the store answers was checked where it entered, by the backend that read it
(blobsdk/metadata/backend.py: a bad one is CorruptData, never cached); this cache, in the
same process, does not check it again.

The TTL + LRU map is :class:`_Plans`, not cachetools' ``TLRUCache``: a lookup is on every
``get``, and ``TLRUCache.get`` took ~30% of a 4 KiB get served from L1 (~1.5 µs of ~5);
``_Plans.get`` is one dict lookup, a clock read and a ``move_to_end``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from ..auth import GRANT_MARGIN_S
from ..errors import BlobNotFound
from ..wire import BlobInfo, CommitOp, ReadPlan, WriteKind
from .base import MetadataStore, PassThrough


def grants_usable_for(grants_expire: float) -> float:
    """Seconds a cached plan whose grants expire at ``grants_expire`` (unix time; 0: it has
    none) may still be served: until ``GRANT_MARGIN_S`` (blobsdk.auth) before they expire, by
    this machine's clock.  Infinite for a plan without grants.  The rule of both plan caches
    (this one and shared.py)."""
    return grants_expire - GRANT_MARGIN_S - time.time() if grants_expire else float("inf")


class CachedMetadataStore(PassThrough):
    """A MetadataStore wrapper with a TTL + LRU plan cache (``ttl_seconds=0`` disables it)."""

    def __init__(
        self,
        store: MetadataStore,
        *,
        ttl_seconds: float = 10.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_seconds < 0 or max_entries < 1:
            raise ValueError(f"plan cache needs ttl_seconds >= 0 and max_entries >= 1, got {ttl_seconds}, {max_entries}")
        super().__init__(store)
        self._enabled = ttl_seconds > 0
        self._ttl = ttl_seconds
        self._clock = clock
        self._plans = _Plans(max_entries, clock)
        self.hits = 0
        self.misses = 0
        # Per path, while calls for it are in flight: how many, and the newest version seen
        # with its plan (None: this client deleted that version, a tombstone).
        self._in_flight: dict[str, int] = {}
        self._newest: dict[str, tuple[int, ReadPlan | None]] = {}

    def peek(self, path: str) -> ReadPlan | None:
        """A cached plan or None, synchronously (the read path's fast path).  Only valid
        paths are ever cached, so a hit needs no path validation."""
        plan = self._plans.get(path)
        if plan is not None:
            self.hits += 1
        return plan

    async def get_plan(self, path: str) -> ReadPlan:
        plan = self.peek(path)
        if plan is None:
            self.misses += 1
            with self._flight([path]):
                plan = self._remember(await self.store.get_plan(path), path)
            if plan is None:
                raise BlobNotFound(f"no blob at {path!r}")
        return plan

    async def get_plans(self, paths: Sequence[str]) -> list[ReadPlan | None]:
        """Cached plans, plus one batch lookup for every path not cached."""
        found = {p: plan for p in paths if (plan := self.peek(p)) is not None}
        missing = [p for p in dict.fromkeys(paths) if p not in found]
        if missing:
            self.misses += len(missing)
            with self._flight(missing):
                for path, plan in zip(missing, await self.store.get_plans(missing), strict=True):
                    if plan is not None and (newest := self._remember(plan, path)) is not None:
                        found[path] = newest
        return [found.get(p) for p in paths]

    async def commit(self, path: str, plan: ReadPlan, if_version: int | None = None) -> ReadPlan:
        self._plans.discard(path)
        with self._flight([path]):
            committed = await self.store.commit(path, plan, if_version)
            self._remember(committed, path)
        return committed

    async def commit_many(self, ops: Sequence[CommitOp]) -> list[ReadPlan]:
        """Commit, and cache each committed plan unless a newer version of its path is
        already known (two commits of one path in flight may answer out of order)."""
        paths = [op.path for op in ops]
        for path in paths:
            self._plans.discard(path)
        with self._flight(paths):
            committed = await self.store.commit_many(ops)
            for plan, path in zip(committed, paths, strict=True):
                self._remember(plan, path)
        return committed

    async def delete(self, path: str, if_version: int | None = None, *, kind: WriteKind = "blob") -> BlobInfo:
        self._plans.discard(path)
        with self._flight([path]):
            try:
                deleted = await self.store.delete(path, if_version, kind=kind)
            finally:
                self._plans.discard(path)
            self._saw(path, deleted.version, None)
        return deleted

    def _remember(self, plan: ReadPlan, path: str) -> ReadPlan | None:
        """Cache and return a plan the store answered for ``path``, unless this cache has seen
        a newer version of the path: then return that (None if this client deleted it) and
        leave the cache alone."""
        newer = self._newer_than(path, plan.version)
        if newer is not None:
            return newer[1]
        self._saw(path, plan.version, plan)
        expires = self._clock() + min(self._ttl, grants_usable_for(plan.grants_expire))
        if self._enabled and expires > self._clock():
            self._plans.set(path, plan, expires)
        else:
            self._plans.discard(path)
        return plan

    def _newer_than(self, path: str, version: int) -> tuple[int, ReadPlan | None] | None:
        """The newest version (and plan) seen of ``path`` if it is newer than ``version``
        (a tombstone of ``version`` itself is newer: that version is gone)."""
        cached = self._plans.get(path)
        if cached is not None and cached.version > version:
            return cached.version, cached
        seen = self._newest.get(path)
        if seen is not None and (seen[0] > version or (seen[0] == version and seen[1] is None)):
            return seen
        return None

    def _saw(self, path: str, version: int, plan: ReadPlan | None) -> None:
        """Record ``version`` (``plan`` None: deleted by this client) as the newest of
        ``path`` while calls for it are in flight."""
        if path in self._in_flight and self._newer_than(path, version) is None:
            self._newest[path] = (version, plan)

    @contextmanager
    def _flight(self, paths: Iterable[str]) -> Iterator[None]:
        """Count a store call for ``paths`` as in flight; the last one out drops the path's
        newest-version record (later lookups start after every write it recorded)."""
        paths = list(paths)
        for path in paths:
            self._in_flight[path] = self._in_flight.get(path, 0) + 1
        try:
            yield
        finally:
            for path in paths:
                left = self._in_flight.pop(path) - 1
                if left:
                    self._in_flight[path] = left
                else:
                    self._newest.pop(path, None)

    def invalidate(self, path: str | None = None) -> None:
        """Forget one path's plan, or every plan."""
        if path is None:
            self._plans.clear()
        else:
            self._plans.discard(path)

    def stats(self) -> dict[str, int | float]:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._plans)}

    async def aclose(self) -> None:
        await self.store.aclose()


class _Plans:
    """Path -> plan, each with the ``clock`` time it goes stale (after the TTL, or a margin
    before its grants expire by this machine's wall clock), at most ``max_entries``: the least
    recently used goes first.  A stale plan is dropped when looked up or pushed out."""

    __slots__ = ("_clock", "_entries", "_max")

    def __init__(self, max_entries: int, clock: Callable[[], float]) -> None:
        self._entries: OrderedDict[str, tuple[ReadPlan, float]] = OrderedDict()
        self._max = max_entries
        self._clock = clock

    def get(self, path: str) -> ReadPlan | None:
        entry = self._entries.get(path)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._entries[path]
            return None
        self._entries.move_to_end(path)
        return entry[0]

    def set(self, path: str, plan: ReadPlan, expires: float) -> None:
        self._entries[path] = (plan, expires)
        self._entries.move_to_end(path)
        if len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def discard(self, path: str) -> None:
        self._entries.pop(path, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
