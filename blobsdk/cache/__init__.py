"""Chunk caches: the ``ChunkCache`` protocol and its two engines, ``MemoryCache`` (the SDK's
L1) and ``DiskCache`` (its L2, and the L3 node's store: one verified file per chunk, a
directory other processes may share).

The engines are private modules behind this face (``_memory.py``; ``_disk.py`` and its parts),
as zarr's backends are behind ``zarr.storage``: the tiers, the flash node and users import
these names from here.  ``base.py`` (the protocol, whose docstring is the contract every engine
holds) and ``policy.py`` (the eviction order that contract names, which both engines share)
keep public names: they are rules to read, not engines."""

from __future__ import annotations

from ._disk import DiskCache
from ._memory import MemoryCache
from ._payloadfile import PayloadFile
from .base import ChunkCache, validate_key

__all__ = ["ChunkCache", "DiskCache", "MemoryCache", "PayloadFile", "validate_key"]
