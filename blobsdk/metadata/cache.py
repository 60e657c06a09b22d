"""The read-plan cache: an in-process TTL cache in front of any MetadataStore.

Staleness rule: a plan served from the cache is at most ``ttl_seconds`` old, and a plan
whose chunk grants (blobsdk.auth) expire within ``GRANT_MARGIN_S`` is not served at all:
the next read asks the store again, for fresh grants.  This client's
own commits and deletes update the cache at once, so a client always reads its own writes;
another client's write becomes visible here within ``ttl_seconds``.  Missing paths are not
cached, so a blob created elsewhere is visible at once.  Chunk caches cannot be stale at all
(chunk keys name immutable bytes); only plans can.

Every plan that arrives from the store, read or committed, is checked against the plan rules
(:func:`blobsdk.plans.checked_plan`) before it is cached or returned: whatever the backend, a
client never reads through a bad plan; it gets CorruptData.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import AsyncIterator, Sequence

import cachetools

from ..auth import grants_usable_for
from ..plans import checked_plan
from ..wire import BlobInfo, CommitOp, ReadPlan
from .base import MetadataStore


class CachedMetadataStore:
    """A MetadataStore wrapper with a TTL + LRU plan cache (``ttl_seconds=0`` disables it)."""

    def __init__(self, store: MetadataStore, *, ttl_seconds: float = 10.0, max_entries: int = 100_000) -> None:
        if ttl_seconds < 0 or max_entries < 1:
            raise ValueError(f"plan cache needs ttl_seconds >= 0 and max_entries >= 1, got {ttl_seconds}, {max_entries}")
        self.store = store
        self._enabled = ttl_seconds > 0
        self._ttl = ttl_seconds
        self._plans: cachetools.TLRUCache[str, ReadPlan] = cachetools.TLRUCache(max_entries, self._expiry, timer=time.monotonic)
        self.hits = 0
        self.misses = 0

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
            plan = self._remember(await self.store.get_plan(path), path)
        return plan

    async def get_plans(self, paths: Sequence[str]) -> list[ReadPlan | None]:
        """Cached plans, plus one batch lookup for every path not cached."""
        found = {p: plan for p in paths if (plan := self.peek(p)) is not None}
        missing = [p for p in dict.fromkeys(paths) if p not in found]
        if missing:
            self.misses += len(missing)
            for path, plan in zip(missing, await self.store.get_plans(missing), strict=True):
                if plan is not None:
                    found[path] = self._remember(plan, path)
        return [found.get(p) for p in paths]

    async def commit(self, path: str, plan: ReadPlan, if_version: int | None = None) -> ReadPlan:
        self._plans.pop(path, None)
        return self._remember(await self.store.commit(path, plan, if_version), path)

    async def commit_many(self, ops: Sequence[CommitOp]) -> list[ReadPlan]:
        for op in ops:
            self._plans.pop(op.path, None)
        committed = await self.store.commit_many(ops)
        return [self._remember(plan, op.path) for plan, op in zip(committed, ops, strict=True)]

    async def delete(self, path: str, if_version: int | None = None) -> BlobInfo:
        self._plans.pop(path, None)
        try:
            return await self.store.delete(path, if_version)
        finally:
            self._plans.pop(path, None)

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = 1000
    ) -> tuple[list[BlobInfo], str | None]:
        return await self.store.list_page(prefix, start_after, limit)

    def list(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> AsyncIterator[BlobInfo]:
        return self.store.list(prefix, start_after, limit)

    async def scan_page(self, start_after: str | None = None, limit: int = 1000) -> tuple[builtins.list[ReadPlan], str | None]:
        return await self.store.scan_page(start_after, limit)

    def iter_plans(self) -> AsyncIterator[ReadPlan]:
        return self.store.iter_plans()

    async def fence_blocks(self, block_ids: Sequence[str]) -> None:
        await self.store.fence_blocks(block_ids)

    async def unfence_blocks(self, block_ids: Sequence[str]) -> None:
        await self.store.unfence_blocks(block_ids)

    async def prune_fences(self, older_than: float) -> int:
        return await self.store.prune_fences(older_than)

    def _remember(self, plan: ReadPlan, path: str) -> ReadPlan:
        """Check a plan the store answered for ``path`` (CorruptData), cache and return it."""
        checked_plan(plan, path)
        if self._enabled and self._expiry(path, plan, time.monotonic()) > time.monotonic():
            self._plans[path] = plan
        else:
            self._plans.pop(path, None)
        return plan

    def _expiry(self, path: str, plan: ReadPlan, now: float) -> float:
        """When (monotonic) the cached ``plan`` goes stale: after the TTL, or a margin
        before its grants expire by this machine's wall clock."""
        return now + min(self._ttl, grants_usable_for(plan.grants_expire))

    def invalidate(self, path: str | None = None) -> None:
        """Forget one path's plan, or every plan."""
        if path is None:
            self._plans.clear()
        else:
            self._plans.pop(path, None)

    def stats(self) -> dict[str, int | float]:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._plans)}

    async def aclose(self) -> None:
        await self.store.aclose()
