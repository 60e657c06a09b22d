"""The metadata store: blob path -> current read plan.  Its protocols, one per capability
(``PlanReader``, ``PlanWriter``, ``PlanLister``, ``BlockFences``, ``BlockIndex``; a
``MetadataStore`` is all of them), the base a backend derives (``MetadataBackend``: every
argument and answered plan checked once), the backends (SQLite, Redis, the API server's HTTP
client) and the read-plan caches in front of any of them.

The backends and caches load their module on first use: a process loads only those its
config names, and the Redis ones need the ``redis`` extra."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .backend import MetadataBackend
from .base import (
    MAX_FENCE_IDS,
    BlockFences,
    BlockIndex,
    MetadataStore,
    PlanLister,
    PlanReader,
    PlanWriter,
    RetryAwareStore,
)

if TYPE_CHECKING:
    from ._cache import CachedMetadataStore
    from ._http import HttpMetadataStore
    from ._redis import RedisMetadataStore
    from ._shared import SharedPlanCache
    from ._sqlite import SqliteMetadataStore

__getattr__ = lazy_names(
    __name__,
    {
        "CachedMetadataStore": "_cache",
        "HttpMetadataStore": "_http",
        "RedisMetadataStore": "_redis",
        "SharedPlanCache": "_shared",
        "SqliteMetadataStore": "_sqlite",
    },
)

__all__ = [
    "MAX_FENCE_IDS",
    "BlockFences",
    "BlockIndex",
    "CachedMetadataStore",
    "HttpMetadataStore",
    "MetadataBackend",
    "MetadataStore",
    "PlanLister",
    "PlanReader",
    "PlanWriter",
    "RedisMetadataStore",
    "RetryAwareStore",
    "SharedPlanCache",
    "SqliteMetadataStore",
]
