"""The shared read-plan cache (the memcache-like plan cache of the Prometheus
design): plans in Redis, a second level behind each client's in-process cache
(:class:`~blobsdk.metadata.CachedMetadataStore`) and in front of the metadata store (usually the API server),
so that a thousand readers of one dataset ask the API server once per plan and TTL, not a
thousand times.  ``[read] shared_plan_cache_url = "redis://..."`` in client.toml.

Keys, under a namespace: ``ns:pc:{path}:gen``, the path's generation, and
``ns:pc:{path}:<scope>``, a cached plan (msgpack) with the generation it was cached at.  The
``{path}`` hash tag keeps both in one slot of a Redis Cluster.  ``scope`` separates what
different credentials may see: plans carry chunk grants signed for one tenant, so clients
with different tokens never share an entry (the scope is a digest of the token, never the
token).

Staleness: an entry lives ``ttl_seconds`` at most, and never past a margin before its grants
expire.  A commit or delete through this cache bumps the path's generation, which
invalidates the path for every scope at once (no scan); so every client using the cache
reads a write made through it at once.  A plan fetched from the store is cached at the
generation read before the fetch, so an answer that left before a write and arrived after
its bump is never served.  A write that
does not go through it (another deployment's client, a server-side job) is visible within
``ttl_seconds``, as with the in-process cache.  Missing paths are not cached.  If Redis is
down, the cache steps aside: reads and writes go to the store (counted in ``errors``), never
failing because of the cache.  A usable entry whose plan breaks the plan rules or is of
another path is CorruptData (blobsdk/wire.py): its plans enter the process here.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from .._extras import requires_extra

with requires_extra("redis", "blobsdk.metadata.SharedPlanCache"):  # the name users import
    import redis.exceptions as rexc

from ..wire import BlobInfo, CommitOp, ReadPlan, WriteKind, checked_plan
from ._cache import grants_usable_for
from ._redis_connect import client_for
from .base import MetadataStore, PassThrough

log = logging.getLogger(__name__)


class _Entry(msgspec.Struct, array_like=True):
    gen: int
    plan: ReadPlan


_decoder = msgspec.msgpack.Decoder(_Entry)
_encoder = msgspec.msgpack.Encoder()


class SharedPlanCache(PassThrough):
    """A MetadataStore wrapper caching plans in Redis at ``url``; see the module docstring."""

    def __init__(
        self,
        store: MetadataStore,
        url: str,
        *,
        ttl_seconds: float = 10.0,
        token: str | None = None,
        namespace: str = "blobsdk",
        timeout: float = 1.0,
    ) -> None:
        if not ttl_seconds > 0:
            raise ValueError(f"shared plan cache needs ttl_seconds > 0, got {ttl_seconds}")
        super().__init__(store)
        self.url = url
        self.ttl_seconds = ttl_seconds
        self._scope = hashlib.sha256((token or "").encode()).hexdigest()[:16]
        self._ns = namespace
        # A short timeout: a slow cache must cost less than the store it saves a trip to.
        self._connection = client_for(url, timeout=timeout)
        self._redis: Any = self._connection.client
        self.hits = self.misses = self.errors = 0

    def _keys(self, path: str) -> tuple[str, str]:
        base = f"{self._ns}:pc:{{{path}}}"
        return f"{base}:gen", f"{base}:{self._scope}"

    # --- reads -----------------------------------------------------------------------------

    async def get_plan(self, path: str) -> ReadPlan:
        ((found, gen),) = await self._cached([path])
        if found is not None:
            return found
        plan = await self.store.get_plan(path)
        await self._put([(plan, gen)])
        return plan

    async def get_plans(self, paths: Sequence[str]) -> list[ReadPlan | None]:
        paths = list(paths)
        cached = await self._cached(paths)
        gens = {p: gen for p, (plan, gen) in zip(paths, cached, strict=True) if plan is None}
        if not gens:
            return [plan for plan, _ in cached]
        missing = list(gens)
        fetched = dict(zip(missing, await self.store.get_plans(missing), strict=True))
        await self._put([(plan, gens[path]) for path, plan in fetched.items() if plan is not None])
        return [plan if plan is not None else fetched.get(path) for path, (plan, _) in zip(paths, cached, strict=True)]

    async def _cached(self, paths: builtins.list[str]) -> builtins.list[tuple[ReadPlan | None, int | None]]:
        """Each path's cached plan if its generation is current and it is not near its
        grants' expiry (None otherwise), with the generation read (None if Redis fails)."""
        if not paths:
            return []
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for path in paths:
                    pipe.mget(*self._keys(path))
                answers = await pipe.execute()
        except (rexc.RedisError, OSError) as exc:
            self._failed(exc)
            return [(None, None)] * len(paths)
        found: builtins.list[tuple[ReadPlan | None, int | None]] = []
        for path, (gen, raw) in zip(paths, answers, strict=True):
            entry = self._entry(raw)
            usable = entry is not None and entry.gen == int(gen or 0) and not _near_expiry(entry.plan)
            # A plan read back from Redis enters here: anyone who can write that Redis could
            # have put it there (CorruptData, as from any metadata store).
            found.append((checked_plan(entry.plan, path) if usable and entry is not None else None, int(gen or 0)))
        hits = sum(plan is not None for plan, _ in found)
        self.hits += hits
        self.misses += len(found) - hits
        return found

    def _entry(self, raw: bytes | None) -> _Entry | None:
        """A cached entry, or None: none cached, or one that does not decode (a damaged or
        foreign value under our key is a miss, counted in ``errors``, never an exception)."""
        if raw is None:
            return None
        try:
            return _decoder.decode(raw)
        except msgspec.DecodeError as exc:
            self._failed(exc)
            return None

    async def _put(self, plans: builtins.list[tuple[ReadPlan, int | None]]) -> None:
        """Cache each plan at the generation read before it was fetched (None: not read, so
        not cached).  A commit or delete that bumps the generation after that read makes the
        entry unusable, so an answer that left before a write and arrived after it (an older
        version) is never served: the generation is never read again after the fetch."""
        entries = [(plan, gen) for plan, gen in plans if gen is not None and self._ttl_of(plan) > 0]
        if not entries:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for plan, gen in entries:
                    pipe.set(self._keys(plan.path)[1], _encoder.encode(_Entry(gen, plan)), px=self._ttl_of(plan))
                await pipe.execute()
        except (rexc.RedisError, OSError) as exc:
            self._failed(exc)

    def _ttl_of(self, plan: ReadPlan) -> int:
        """Milliseconds: the TTL, or less if the grants expire sooner."""
        return int(min(self.ttl_seconds, grants_usable_for(plan.grants_expire)) * 1000)

    # --- writes: to the store, then the generation ------------------------------------------

    async def commit(self, path: str, plan: ReadPlan, if_version: int | None = None) -> ReadPlan:
        (committed,) = await self.commit_many([CommitOp(path=path, plan=plan, if_version=if_version)])
        return committed

    async def commit_many(self, ops: Sequence[CommitOp]) -> list[ReadPlan]:
        """Commit, then bump the generations.  The committed plans are not cached here: the
        bumps of two clients' commits of one path may land in either order, so an entry put
        at the generation after a bump could be the older commit's.  The next read fills it."""
        committed = await self.store.commit_many(ops)
        await self._bump([op.path for op in ops])
        return committed

    async def delete(self, path: str, if_version: int | None = None, *, kind: WriteKind = "blob") -> BlobInfo:
        try:
            return await self.store.delete(path, if_version, kind=kind)
        finally:
            await self._bump([path])

    async def _bump(self, paths: builtins.list[str]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for path in dict.fromkeys(paths):
                    gen = self._keys(path)[0]
                    pipe.incr(gen)
                    pipe.pexpire(gen, int(self.ttl_seconds * 1000) * 2)  # outlives every entry of the old one
                await pipe.execute()
        except (rexc.RedisError, OSError) as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if self.errors == 0:
            log.warning("shared plan cache %s is failing (%s): reads go to the metadata store", self.url, exc)
        self.errors += 1

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "errors": self.errors}

    async def aclose(self) -> None:
        try:
            await self.store.aclose()
        finally:
            await self._connection.aclose()


def _near_expiry(plan: ReadPlan) -> bool:
    return grants_usable_for(plan.grants_expire) <= 0
