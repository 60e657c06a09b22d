"""The Tier protocol: one level of the read path (DESIGN §2).

The read path (readpath.py) walks its tiers in order for each chunk: L1 memory, L2 local
disk, (peers), L3 regional flash, L4 durable.  A tier either serves the chunk's verified raw
bytes or returns None (a miss: not there, its servers down, every copy it had was bad), and
the next tier is tried.  The last tier (L4) raises instead of returning None.

Remote tiers receive their candidate copies in the *stored* form (maybe lz4) and hand each
to ``decode``, which decodes and checks the ChunkRef checksum, raising BadCopy for a copy
that does not match; the tier then counts it as ``corrupt`` and tries its next candidate.
Local tiers hold raw bytes that were verified before they were filled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from ..errors import CorruptData
from ..stats import TierStats
from ..wire import ChunkRef

Decoder = Callable[[ChunkRef, memoryview], Awaitable[memoryview]]


class BadCopy(CorruptData):
    """One copy of a chunk failed verification (the caller tries another copy)."""


@runtime_checkable
class Tier(Protocol):
    @property
    def name(self) -> str:
        """"l1", "l2", "peer", "l3" or "l4": the key of this tier in ``client.stats()``."""
        ...

    @property
    def stats(self) -> TierStats: ...

    async def fetch(self, ref: ChunkRef, decode: Decoder) -> memoryview | None:
        """The verified raw bytes of ``ref``, or None if this tier cannot serve them."""
        ...

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """Offer raw bytes that a lower tier served (a tier may ignore or defer them)."""
        ...

    async def flush(self) -> None:
        """Wait until deferred fills are done (a no-op for tiers that defer nothing)."""
        ...

    def extra_stats(self) -> dict[str, int | float]:
        """Tier-specific counters added to its ``client.stats()`` entry."""
        ...

    async def aclose(self) -> None: ...
