"""The BlockStore protocol: L4, the durable source of truth, as immutable blocks.

Semantics every backend holds (tests/sources/conformance.py checks them):

- ``write_block(block_id, parts)`` stores the concatenation of ``parts`` under ``block_id``
  and returns only once it is durable.  Blocks are immutable: writing an existing id with
  the same size is a no-op, with another size PreconditionFailed; never a partial overwrite.
- ``read_into(block_id, offset, out, attempt=None)`` fills ``out`` (a writable memoryview)
  with the bytes at ``offset``; ``attempt`` is the hedged attempt the read is, which a store
  that waits in a client-side queue (a concurrency permit) marks queued meanwhile; a
  missing block raises BlockNotFound, a range past the end of the block raises CorruptData
  (a plan never points past a block).
- ``read_range`` is the same returning new bytes.  A zero-length read returns ``b""``
  after checking the id, without I/O.
- ``delete_block`` is idempotent; ``list_blocks`` yields every block, sorted by id (a
  replicated store fails the listing if any replica cannot list, rather than return an
  incomplete union that gc could misread).
- Block ids are 32 lowercase hex digits (:func:`new_block_id`); any other id is refused
  with BadRequest before it comes near a file name or URL.
- ``replicas`` lists the independent copies a reader may fail over between (verifying
  each answer itself); a single backend is its own only replica.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from .._ids import validate_hex32
from ..hedge import Attempt
from ..wire import BlockInfo

Buffer = bytes | bytearray | memoryview


def new_block_id() -> str:
    """48 bits of milliseconds since the epoch, then 80 random bits: sortable by age."""
    return f"{int(time.time() * 1000):012x}{os.urandom(10).hex()}"


def validate_block_id(block_id: object) -> str:
    return validate_hex32(block_id, "block id")


@runtime_checkable
class BlockStore(Protocol):
    @property
    def name(self) -> str:
        """Human-readable identity (a URL or directory) for stats and errors."""
        ...

    @property
    def replicas(self) -> Sequence[BlockStore]: ...

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None: ...

    async def read_into(
        self, block_id: str, offset: int, out: memoryview, *, attempt: Attempt | None = None, grant: str = ""
    ) -> None:
        """Fill ``out`` with the bytes of ``block_id`` at ``offset``.  ``attempt``: the
        hedged read this is one attempt of; ``grant``: the chunk grant for exactly these
        bytes (blobsdk.auth), which a server with tenants wants."""
        ...

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes: ...

    async def delete_block(self, block_id: str) -> None: ...

    def list_blocks(self) -> AsyncIterator[BlockInfo]: ...

    async def aclose(self) -> None: ...


def block_time(block_id: str) -> float:
    """Unix time (seconds) a block id was minted, read from its first 12 hex digits."""
    return int(validate_block_id(block_id)[:12], 16) / 1000.0
