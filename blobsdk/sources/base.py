"""The BlockStore protocols: L4, the durable source of truth, as immutable blocks.

Two protocols, because L4 is written as a whole and read one copy at a time:

- :class:`BlockStore`: L4 as a whole, what the writer, gc and the L4 tier are given:
  ``write_block``, ``delete_block``, ``list_blocks``, and ``replicas``, its independent copies.
- :class:`BlockReplica`: one copy (one backend: a directory, a block server, an S3 bucket),
  a BlockStore that can also be read (``read_into``, ``read_range``).  A single backend is
  its own only replica.

A store of several replicas (blobsdk/sources/_replicated.py) is a BlockStore and no
BlockReplica: the one reader of L4 is the replicated read engine
(blobsdk/tail/replicaread.py: the L4 tier's and the L3 node's), which reads each
replica itself, verifying every copy and failing over between them.

Semantics every backend holds (blobsdk/testing/sources.py checks them):

- ``write_block(block_id, parts)`` stores the concatenation of ``parts`` under ``block_id``
  and returns only once it is durable.  Blocks are immutable: writing an existing id with
  the same size is a no-op, with another size PreconditionFailed; never a partial overwrite.
- ``read_into(block_id, offset, out, call=None)`` fills ``out`` (a writable memoryview)
  with the bytes at ``offset``; ``call`` (blobsdk/chunks/call.py) is the read: its demand,
  its grant, and the hooks of the hedged attempt it is, which a store that waits in a
  client-side queue (a concurrency permit) marks queued meanwhile; a
  missing block raises BlockNotFound, a range past the end of the block raises CorruptData
  (a plan never points past a block).
- ``read_range`` is the same returning new bytes.  A zero-length read returns ``b""``
  after checking the id, without I/O.
- ``delete_block`` is idempotent; ``list_blocks`` yields every block, sorted by id (a
  replicated store fails the listing if any replica cannot list, rather than return an
  incomplete union that gc could misread).
- Block ids are 32 lowercase hex digits (:func:`new_block_id`); any other id is refused
  with BadRequest before it comes near a file name or URL.  An id that begins with
  :data:`LINK_TAG` names a *link block* (:func:`new_link_id`): an object indexed in place
  (blobsdk/sources/_s3.py), whose bytes stay in that object.
- ``replicas`` lists the independent copies a reader fails over between (verifying each
  answer itself); a single backend is its own only replica.

A replica may also read several spans of one block in one request (:class:`SpanReader`,
``read_spans``): a restore's many chunks of a block, straight into the caller's memory.
The local store does (one open, one ``preadv`` for each run of adjacent spans, each span
checked on the thread that read it); a block server or S3 could with one multi-range or
single-range GET; the others do not, and are read one chunk at a time.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import xxhash

from ..chunks import Call, validate_block_id
from ..errors import BlobError
from ..wire import BlockInfo

Buffer = bytes | bytearray | memoryview


LINK_TAG = "f"  # written blocks' ids begin with "0" until the year 2527 (their first digit is time's)


def new_block_id() -> str:
    """48 bits of milliseconds since the epoch, then 80 random bits: sortable by age."""
    return f"{int(time.time() * 1000):012x}{os.urandom(10).hex()}"


def new_link_id(identity: str) -> str:
    """A link block's id: :data:`LINK_TAG`, 44 bits of milliseconds since the epoch (the
    link's age, for gc), then 80 bits of xxh3 of ``identity`` (what it links to, so a
    reader can tell a link of that same thing without reading it: :func:`links_to`)."""
    return f"{LINK_TAG}{int(time.time() * 1000):011x}{link_digest(identity)}"


def link_digest(identity: str) -> str:
    return xxhash.xxh3_128_hexdigest(identity.encode())[:20]


def is_link(block_id: str) -> bool:
    return block_id.startswith(LINK_TAG)


def links_to(block_id: str, identity: str) -> bool:
    """Whether ``block_id`` is a link block made for ``identity``."""
    return is_link(block_id) and block_id[12:] == link_digest(identity)


@runtime_checkable
class BlockStore(Protocol):
    """L4 as a whole: written, listed and deleted here, read through its ``replicas``."""

    @property
    def name(self) -> str:
        """Human-readable identity (a URL or directory) for stats and errors."""
        ...

    @property
    def replicas(self) -> Sequence[BlockReplica]: ...

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None: ...

    async def delete_block(self, block_id: str) -> None: ...

    def list_blocks(self) -> AsyncIterator[BlockInfo]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class BlockReplica(BlockStore, Protocol):
    """One independent copy of L4: a BlockStore that can be read."""

    async def read_into(self, block_id: str, offset: int, out: memoryview, *, call: Call | None = None) -> None:
        """Fill ``out`` with the bytes of ``block_id`` at ``offset``.  ``call``: the read
        (its demand, the hedged attempt it is, and its ``grant``: the chunk grant for exactly
        these bytes, blobsdk.auth, which a server with tenants wants).  Cancelled, it ends (raises
        CancelledError) only once nothing writes into ``out`` any more: a thread's read is
        waited for, a connection receiving into it is closed."""
        ...

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Span:
    """``length`` bytes of a block at ``offset``, to be read into ``windows`` one after
    another (writable byte views whose sizes add up to ``length``); ``grant``: the chunk
    grant for exactly these bytes, for a server with tenants (blobsdk.auth)."""

    offset: int
    length: int
    windows: tuple[memoryview, ...]
    grant: str = ""


SpanCheck = Callable[[int], None]  # called with a span's index once its bytes are in; raises if they are bad


@runtime_checkable
class SpanReader(Protocol):
    """A replica that reads several spans of one block in one request, into the caller's
    memory (see the module docstring)."""

    async def read_spans(
        self, block_id: str, spans: Sequence[Span], *, check: SpanCheck | None = None, call: Call | None = None
    ) -> list[BlobError | None]:
        """Read every span of ``block_id`` into its windows, spans adjacent in the block
        (``spans[i].offset + spans[i].length == spans[i + 1].offset``) with one read where
        the backend can; ``check(i)``, if given, runs where span ``i`` was read (the local
        store's thread), once its bytes are in.  Per span: None, or the error about that span
        alone (CorruptData for a span past the end of the block, the BlobError ``check``
        raised).  An error about the whole block (BlockNotFound, Unavailable) is raised.
        It returns or raises, cancelled included, only once nothing writes into the windows
        any more (a cancelled read stops at its next span, and is waited for)."""
        ...


def block_time(block_id: str) -> float:
    """Unix time (seconds) a block id was minted, read from its first 12 hex digits (a link
    block's from the 11 after its tag)."""
    block_id = validate_block_id(block_id)
    return int(block_id[1:12] if is_link(block_id) else block_id[:12], 16) / 1000.0
