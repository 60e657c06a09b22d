"""The in-memory chunk cache (the SDK's L1): a byte-budgeted LRU with optional TTL, hold
period, pins and per-tenant quotas, whose reads return the stored object itself.

Why not cachetools: ``LRUCache``/``TTLCache`` with ``getsizeof`` budget bytes, but they
evict inside ``__setitem__`` in their own order, so they cannot skip pinned or held entries,
put expired entries first, or refuse a put without evicting anything.  The engine instead
keeps an OrderedDict-based :class:`~blobsdk.cache.policy.Index` and lets the shared
:class:`~blobsdk.cache.policy.PolicyChain` pick victims, the same code the disk engine uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..chunks import ChunkKey
from ..runtime import AsyncResource
from .base import DEFAULT_TENANT, Buffer, validate_key
from .policy import Entry, PolicyChain, validate_tenant


class MemoryCache(AsyncResource):
    """A :class:`~blobsdk.cache.base.ChunkCache` in process memory.

    The hot path is synchronous: :meth:`get_nowait` (a hit costs a dict lookup, a clock
    read and an LRU move: ~0.3 µs) and :meth:`put_nowait`; the async methods of the
    protocol are thin wrappers.  :meth:`lookup`, :meth:`fill` and :meth:`holds` are those
    two and ``contains`` for a key already checked (a :data:`~blobsdk.chunks.names.ChunkKey`):
    the L1 tier's.  Reads are zero-copy: they return the stored ``bytes`` or a read-only
    memoryview of the caller's buffer, so a caller of :meth:`put_nowait` must not mutate
    ``data`` afterwards.  ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        ttl_seconds: float | None = None,
        hold_seconds: float = 0.0,
        quotas: Mapping[str, int] | None = None,
        name: str = "memory",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must not be negative, got {capacity_bytes}")
        self._name = name
        self._capacity = capacity_bytes
        self._clock = clock
        self._chain = PolicyChain(ttl_seconds=ttl_seconds, hold_seconds=hold_seconds, quotas=quotas)
        self._ttl = self._chain.ttl
        self._index = self._chain.new_index()
        self._lookup = self._index.lru.get  # bound once: the hot path's first step
        self._data: dict[str, bytes | memoryview] = {}
        self._counts = dict.fromkeys(("hits", "misses", "puts"), 0)

    @property
    def name(self) -> str:
        return self._name

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._index.used

    def get_nowait(self, key: str) -> bytes | memoryview | None:
        """The stored object for ``key`` (not a copy) or None; a hit becomes the most
        recently used entry.  A key that is not a chunk key is BadRequest: only a miss
        checks, since every stored key was checked when it was put."""
        try:
            stored = key in self._data
        except TypeError:  # unhashable: certainly not a key
            stored = False
        return self.lookup(ChunkKey(key) if stored else validate_key(key))  # a stored key was checked by its put

    def lookup(self, key: ChunkKey) -> bytes | memoryview | None:
        """:meth:`get_nowait` of a key already checked (a checked ref's, the L1 tier's)."""
        entry = self._lookup(key)
        if entry is None:
            self._counts["misses"] += 1
            return None
        now = self._clock()
        if self._ttl is not None and self._ttl.expired(entry, now):
            self._expire(entry)
            return None
        self._index.touch(entry, now)
        self._counts["hits"] += 1
        return self._data[key]

    def put_nowait(self, key: str, data: Buffer, *, tenant: str = DEFAULT_TENANT, pin_seconds: float = 0.0) -> bool:
        """Store ``data`` (kept as is if ``bytes``, else as a read-only view of it: do not
        mutate it afterwards).  False if it cannot be admitted; QuotaExceeded if ``tenant``'s
        quota cannot hold it (and nothing changed).  A put replaces ``key``; if it is not
        admitted, ``key`` is gone."""
        return self.fill(validate_key(key), data, tenant=validate_tenant(tenant), pin_seconds=pin_seconds)

    def fill(self, key: ChunkKey, data: Buffer, *, tenant: str = DEFAULT_TENANT, pin_seconds: float = 0.0) -> bool:
        """:meth:`put_nowait` of a key and tenant already checked (the L1 tier's fills).
        Without quotas or a hold period an entry that fits evicts nothing
        (:meth:`PolicyChain.admit`): it is added without asking the policies."""
        value = data if type(data) is bytes else memoryview(data).cast("B").toreadonly()
        size = len(value)
        now = self._clock()
        entry = Entry(key, size, now, now, tenant, now + pin_seconds if pin_seconds > 0 else 0.0)
        chain, index = self._chain, self._index
        if chain.quota is not None:
            chain.check_quota(index, entry, now)  # before anything changes: a refusal changes nothing
        self._remove(key)
        if not chain.fits_free or index.used + size > self._capacity:
            victims = chain.admit(index, entry, self._capacity, now)
            if victims is None:
                return False
            for _, victim in victims:
                del self._data[victim.key]
        index.add(entry)
        self._data[key] = value
        self._counts["puts"] += 1
        return True

    def pin(self, key: str, seconds: float) -> bool:
        """Protect a present entry from eviction for ``seconds`` more; False if absent."""
        entry = self._index.get(validate_key(key))
        if entry is None:
            return False
        entry.pin_until = max(entry.pin_until, self._clock() + seconds)
        return True

    def tenant_usage(self) -> dict[str, int]:
        """Bytes stored per tenant."""
        return dict(self._index.tenant_bytes)

    async def get(self, key: str) -> bytes | memoryview | None:
        return self.get_nowait(key)

    async def put(self, key: str, data: Buffer, *, tenant: str = DEFAULT_TENANT, pin_seconds: float = 0.0) -> bool:
        return self.put_nowait(key, data, tenant=tenant, pin_seconds=pin_seconds)

    async def delete(self, key: str) -> bool:
        return self._remove(validate_key(key)) is not None

    def contains(self, key: str) -> bool:
        return self.holds(validate_key(key))

    def holds(self, key: ChunkKey) -> bool:
        """:meth:`contains` of a key already checked."""
        return key in self._data

    def stats(self) -> dict[str, int | float]:
        return {
            **self._counts,
            "corrupt": 0,  # memory holds bytes verified before they were put
            "errors": 0,
            "bytes": self._index.used,
            "entries": len(self._index),
            "capacity_bytes": self._capacity,
            **self._chain.stats(),
        }

    async def aclose(self) -> None:
        """Drop every entry (frees the memory).  Idempotent."""
        self._index.clear()
        self._data.clear()

    def _expire(self, entry: Entry) -> None:
        del self._data[entry.key]
        self._chain.expire(self._index, entry)
        self._counts["misses"] += 1

    def _remove(self, key: str) -> Entry | None:
        self._data.pop(key, None)
        return self._index.remove(key)
