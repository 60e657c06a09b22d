"""The ChunkCache protocol: bytes by chunk key, shared by the SDK tiers (L1 memory, L2 local
disk) and the L3 flash node.

Semantics every engine holds (blobsdk/testing/cache.py checks them):

- Keys are chunk keys: 32 lowercase hex digits (:attr:`blobsdk.wire.ChunkRef.key`).  Any
  other key raises BadRequest before it comes near a dict or a file name (:func:`validate_key`,
  which types it :data:`~blobsdk.chunks.names.ChunkKey`; an engine's methods that take a
  ChunkKey, as MemoryCache's ``lookup`` and ``fill``, do not check it again).
- ``get(key)`` returns the bytes last ``put`` under ``key`` or None (a miss).  An engine that
  finds a damaged copy (disk: checksum mismatch, truncation) deletes it, counts it as
  ``corrupt`` and reports a miss: it never returns wrong bytes.
- ``put(key, data, tenant=..., pin_seconds=...)`` stores a copy, all or nothing, and returns
  True; it returns False when the entry cannot be admitted (larger than the capacity, disk
  full): a cache that cannot store is a miss next time, never an error for the reader.
  It raises QuotaExceeded only when ``tenant`` has a quota and even after evicting that
  tenant's own unpinned data the entry would not fit; such a put changes nothing (another
  tenant's copy of ``key`` stays).
- Eviction keeps ``used_bytes <= capacity_bytes``.  The order is decided by the engine's
  policy chain (cache/policy.py): expired entries (TTL) first; then least recently used;
  entries younger than the hold period only if nothing else is left; pinned entries never
  before their pin expires (a put that cannot fit without evicting pinned data returns
  False).
- ``delete`` is idempotent; ``contains`` is a cheap index lookup (no I/O, no LRU touch).
- ``stats()`` has at least hits, misses, puts, evictions, corrupt, bytes (used), entries,
  capacity_bytes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..auth import STATIC_TENANT
from ..chunks import ChunkKey, validate_hex32

Buffer = bytes | bytearray | memoryview

DEFAULT_TENANT = STATIC_TENANT  # whose entries a cache without tenants holds


def validate_key(key: object) -> ChunkKey:
    """``key`` if it is a chunk key (the check where a key enters an engine), else BadRequest."""
    return ChunkKey(validate_hex32(key, "chunk key"))


@runtime_checkable
class ChunkCache(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def capacity_bytes(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...

    async def get(self, key: str) -> Buffer | None: ...

    async def put(self, key: str, data: Buffer, *, tenant: str = DEFAULT_TENANT, pin_seconds: float = 0.0) -> bool: ...

    async def delete(self, key: str) -> bool: ...

    def contains(self, key: str) -> bool: ...

    def stats(self) -> dict[str, int | float]: ...

    async def aclose(self) -> None: ...
