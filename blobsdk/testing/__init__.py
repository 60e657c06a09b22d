"""Conformance suites for the storage protocols, shipped so that a backend written outside
blobsdk is held to the same contract as blobsdk's own (as ``zarr.testing`` ships its
``StoreTests``).  Each suite is a pytest test class to subclass; docs/testing.md shows how.

- :mod:`blobsdk.testing.metadata`: ``PlanReaderTests``, ``PlanWriterTests``,
  ``PlanListerTests``, ``BlockIndexTests``, ``BlockFencesTests`` (one per capability of
  blobsdk/metadata/base.py) and ``MetadataStoreTests`` (all of them); the plans they commit
  are :mod:`blobsdk.testing.plans`'s.
- :mod:`blobsdk.testing.sources`: ``BlockStoreTests`` and ``BlockReplicaTests``
  (blobsdk/sources/base.py).
- :mod:`blobsdk.testing.cache`: ``ChunkCacheTests`` (blobsdk/cache/base.py).

The suites need pytest and pytest-asyncio (``pip install 'blobsdk[testing]'``); importing one
without them raises MissingExtra naming the extra.  Importing this package imports nothing,
and ``import blobsdk`` never imports it: pytest is loaded only by a test module that imports
a suite: each suite's name here loads its module on first use (blobsdk/_lazy.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .cache import ChunkCacheTests
    from .metadata import (
        BlockFencesTests,
        BlockIndexTests,
        MetadataStoreTests,
        PlanListerTests,
        PlanReaderTests,
        PlanWriterTests,
    )
    from .reserved import ReservedNamespaceTests
    from .sources import BlockReplicaTests, BlockStoreTests

__getattr__ = lazy_names(
    __name__,
    {
        "ChunkCacheTests": "cache",
        "PlanReaderTests": "metadata",
        "PlanWriterTests": "metadata",
        "PlanListerTests": "metadata",
        "BlockIndexTests": "metadata",
        "BlockFencesTests": "metadata",
        "MetadataStoreTests": "metadata",
        "ReservedNamespaceTests": "reserved",
        "BlockStoreTests": "sources",
        "BlockReplicaTests": "sources",
    },
)

__all__ = [
    "BlockFencesTests",
    "BlockIndexTests",
    "BlockReplicaTests",
    "BlockStoreTests",
    "ChunkCacheTests",
    "MetadataStoreTests",
    "PlanListerTests",
    "PlanReaderTests",
    "PlanWriterTests",
    "ReservedNamespaceTests",
]
