"""L4, the durable blocks: the ``BlockStore`` protocol (L4 as a whole) and ``BlockReplica``
(one copy, read), the block id rules, the backends (a local directory, a block server over
HTTP, an S3-compatible object store), and N replicas behind one store
(``ReplicatedBlockStore``).

The backends load their module on first use: a process loads only those its config names,
and the S3 one needs the ``s3`` extra (obstore)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ..chunks import validate_block_id
from ._replicated import RecordsUnderReplicated, ReplicatedBlockStore, UnderReplicated
from .base import BlockReplica, BlockStore, Buffer, Span, SpanReader, block_time, is_link, links_to, new_block_id

if TYPE_CHECKING:
    from ._http import HttpBlockStore
    from ._local import BlockWriter, LocalBlockStore
    from ._s3 import S3BlockStore, S3Object

__getattr__ = lazy_names(
    __name__,
    {
        "HttpBlockStore": "_http",
        "BlockWriter": "_local",
        "LocalBlockStore": "_local",
        "S3BlockStore": "_s3",
        "S3Object": "_s3",
    },
)

__all__ = [
    "BlockReplica",
    "BlockStore",
    "BlockWriter",
    "Buffer",
    "HttpBlockStore",
    "LocalBlockStore",
    "RecordsUnderReplicated",
    "ReplicatedBlockStore",
    "S3BlockStore",
    "S3Object",
    "Span",
    "SpanReader",
    "UnderReplicated",
    "block_time",
    "is_link",
    "links_to",
    "new_block_id",
    "validate_block_id",
]
