"""Chunk caches: the ``ChunkCache`` protocol and its two engines, ``MemoryCache`` (the SDK's
L1) and ``DiskCache`` (its L2, and the L3 node's store: one verified file per chunk, a
directory other processes may share).  The tiers and the flash node import these names from
here; the engines' pieces (the policies, the index, the files) are the package's own."""

from __future__ import annotations

from ._payloadfile import PayloadFile
from .base import ChunkCache, validate_key
from .disk import DiskCache
from .memory import MemoryCache

__all__ = ["ChunkCache", "DiskCache", "MemoryCache", "PayloadFile", "validate_key"]
