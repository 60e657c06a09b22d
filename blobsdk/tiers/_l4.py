"""L4: the durable block store, the last tier of the read path.

The tier is the read path's face of the replicated read engine
(:class:`~blobsdk.tail.replicaread.ReplicaReader`: each chunk hedged across the replicas,
verified, a replica that served bad bytes ranked last a while), which the L3 node's
read-through from L4 uses too.  Being the last tier, L4 never misses quietly: when every
replica failed it raises CorruptData, BlockNotFound or Unavailable.

It owns nothing: the engine is built by blobsdk/assembly.py (the composition root), and the
repair of the blocks its reads found a bad or missing copy of is the client's (the
:class:`~blobsdk.ops.repair.Repairer`, handed to the engine as its
:class:`~blobsdk.tail.replicaread.BlockReport`).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any

from ..chunks import Demand
from ..runtime import AsyncResource, BufferPool
from ..sources import BlockReplica, BlockStore
from ..tail import Hedger, ReplicaReader, TargetHealth
from ..wire import ChunkRef
from .base import Decoder, KeepsNothing, Piece, Verifier


class L4Tier(KeepsNothing, AsyncResource):
    """The Tier over the block store ``engine`` reads (a
    :class:`~blobsdk.tail.replicaread.ReplicaReader`, built by the composition root; not
    owned, nor its store: the client closes its block store itself)."""

    name = "l4"

    def __init__(self, engine: ReplicaReader) -> None:
        self.engine = engine
        self.stats = engine.stats

    @property
    def blocks(self) -> BlockStore:
        return self.engine.blocks

    @property
    def hedger(self) -> Hedger:
        return self.engine.hedger

    @property
    def health(self) -> TargetHealth:
        return self.engine.health

    @property
    def buffers(self) -> BufferPool:
        return self.engine.buffers

    @buffers.setter
    def buffers(self, pool: BufferPool) -> None:
        self.engine.buffers = pool

    def candidates(self, key: str) -> list[BlockReplica]:
        """The replicas in the order a read of chunk ``key`` tries them (ReplicaReader.candidates)."""
        return self.engine.candidates(key)

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """Nothing without a read: ask fetch."""
        return None

    # The reads hand back the engine's coroutine, not one of their own around it: each
    # resumption of a read runs through every coroutine of its chain, so a wrapper would
    # cost a call per resumption.

    def fetch(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> Coroutine[Any, Any, memoryview]:
        """The verified raw bytes of ``ref`` (never None: L4 raises instead)."""
        return self.engine.read_raw(ref, decode, demand)

    def fetch_stored(
        self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None
    ) -> Coroutine[Any, Any, tuple[memoryview, memoryview]]:
        """The verified stored copy of ``ref`` and its raw bytes (ReplicaReader.read)."""
        return self.engine.read(ref, decode, demand)

    def fetch_into(
        self, ref: ChunkRef, out: memoryview, decode: Decoder, demand: Demand | None = None
    ) -> Coroutine[Any, Any, bool]:
        """``ref``'s verified raw bytes read straight into ``out`` (ReplicaReader.read_into)."""
        return self.engine.read_into(ref, out, decode, demand)

    def fetch_many_into(
        self, pieces: Sequence[Piece], verify: Verifier, demand: Demand | None = None
    ) -> Coroutine[Any, Any, bool]:
        """The chunks of ``pieces`` read straight into their windows (ReplicaReader.read_many_into)."""
        return self.engine.read_many_into(pieces, verify, demand)

    async def flush(self) -> None:
        """Nothing deferred."""

    async def aclose(self) -> None:
        """Nothing owned: the block store is the client's, the repairer too."""

    def extra_stats(self) -> dict[str, int | float]:
        return self.engine.figures()

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """Nothing to do: L4 is where every chunk comes from."""
