"""The Tier protocol: one level of the read path (DESIGN §2).

The read path (readpath.py) walks its tiers in order for each chunk: L1 memory, L2 local
disk, (peers), L3 regional flash, L4 durable.  A tier either serves the chunk's verified raw
bytes or returns None (a miss: not there, its servers down, every copy it had was bad), and
the next tier is tried.  The last tier (L4) raises instead of returning None.

Two ways to ask: ``peek`` is synchronous and answers only what a tier knows without an
await (L1's memory); None there means "ask ``fetch``", and counts nothing.  ``fetch`` is
the full lookup, which counts a miss.  A tier that can answer nothing synchronously returns
None from ``peek`` at once.

Remote tiers receive their candidate copies in the *stored* form (maybe lz4) and hand each
to ``decode``, which decodes and checks the ChunkRef checksum, raising BadCopy for a copy
that does not match; the tier then counts it as ``corrupt`` and tries its next candidate.
Local tiers hold raw bytes that were verified before they were filled.

Deep prefetch (blobsdk/read/prefetch.py) asks three more things: ``holds`` (does the tier keep this
chunk now, known without a read: L1's and L2's index), ``finds`` (``holds``, or else the chunk
is where a tier shared with other processes finds it: a file another process put in L2's
directory, looked for on the disk's threads) and ``keep`` (store these bytes and
return only once they are stored: where ``fill`` may drop bytes when the disk is behind, as
L2's write-behind does, ``keep`` waits).  Tiers that keep nothing answer False and ignore it.

A tier is an async context manager: entering it starts what it owns (L2's write-behind
writers), leaving it (or ``aclose``, which is idempotent) stops and closes that.  Bytes
passed to ``fill`` may be kept as they are (see readpath.py on buffer ownership).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Self, runtime_checkable

from ..chunks import Decoder as Decoder
from ..chunks import Demand
from ..chunks import Piece as Piece
from ..chunks import Verifier as Verifier
from ..errors import BlobError
from ..stats import TierStats
from ..wire import ChunkRef


@runtime_checkable
class DirectTier(Protocol):
    """A tier that can read uncompressed chunks straight into the caller's memory (a
    restore into the caller's arrays), with no buffer of its own and no copy after: one at
    a time (``fetch_into``), or many chunks of one block in one request (``fetch_many_into``)."""

    async def fetch_into(self, ref: ChunkRef, out: memoryview, decode: Decoder, demand: Demand | None = None) -> bool:
        """Read ``ref``'s raw bytes into ``out`` (exactly ``ref.raw_length`` bytes) and verify
        them there; False, with nothing written, if this tier cannot do that safely now (it
        would race other attempts into ``out``).  Nothing writes into ``out`` once it has
        returned or raised, cancelled included.  A bad copy raises as ``fetch`` would; ``out``
        then holds what was read."""
        ...

    async def fetch_many_into(self, pieces: Sequence[Piece], verify: Verifier, demand: Demand | None = None) -> bool:
        """Read the chunks of ``pieces`` (all of one block, best in the order of their
        offsets) into their windows, each checked by ``verify`` where it was read; False,
        with nothing written, if this tier cannot do that safely now (then read them one at a
        time).  Counted per chunk as ``fetch`` counts.  The first bad chunk raises as
        ``fetch`` would (the others may be read or not); nothing writes into the windows once
        it has returned or raised, cancelled included."""
        ...


@runtime_checkable
class Tier(Protocol):
    @property
    def name(self) -> str:
        """ "l1", "l2", "peer", "l3" or "l4": the key of this tier in ``client.stats()``."""
        ...

    @property
    def stats(self) -> TierStats: ...

    def peek(self, ref: ChunkRef) -> memoryview | None:
        """The verified raw bytes of ``ref`` if this tier has them without an await, else
        None (then ``fetch`` decides; a miss is counted there, not here)."""
        ...

    @property
    def keeps_fetched(self) -> bool:
        """Whether a buffer ``fetch`` returns may stay with this tier (L1's entries, the peer
        tier's serving cache): then it is shared, read-only, never a reader's own."""
        ...

    async def fetch(self, ref: ChunkRef, decode: Decoder, demand: Demand | None = None) -> memoryview | None:
        """The verified raw bytes of ``ref``, or None if this tier cannot serve them.
        ``demand``: the fetch this is (None: a foreground read); a tier that sends requests
        hands it to its hedger, so they queue at its priority (blobsdk/chunks/call.py).  The
        read path calls it in the chunk's fetch task, which ends once the walk has filled the
        tiers above the one that served, or failed: after a miss, what a tier promised others
        for the chunk (the peer tier's waiting children) ends with that task at the latest."""
        ...

    async def fill(self, ref: ChunkRef, raw: memoryview) -> None:
        """Offer raw bytes that a lower tier served (a tier may ignore or defer them)."""
        ...

    async def flush(self) -> None:
        """Wait until deferred fills are done (a no-op for tiers that defer nothing)."""
        ...

    def holds(self, ref: ChunkRef) -> bool:
        """Whether the tier keeps ``ref`` now, by its index alone (counts nothing)."""
        ...

    async def finds(self, ref: ChunkRef) -> bool:
        """``holds``, or else whether ``ref`` is where the tier finds what other processes
        sharing it stored (then it holds it from now on; counts nothing)."""
        ...

    async def keep(self, ref: ChunkRef, raw: memoryview) -> None:
        """Store raw bytes a lower tier served, waiting until they are stored (a tier that
        keeps nothing ignores them)."""
        ...

    def extra_stats(self) -> dict[str, int | float]:
        """Tier-specific counters added to its ``client.stats()`` entry."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def aclose(self) -> None:
        """Stop and close what the tier owns; closing twice is harmless."""
        ...


def cache_failover(exc: BaseException) -> bool:
    """The hedger's failover rule for a cache tier (L3, peers): any failure of one of its
    servers is a miss there, tried at the next one and in the end at the next tier, never an
    error to the reader."""
    return isinstance(exc, BlobError)


class KeepsNothing:
    """``holds`` and ``keep`` of a tier that keeps no fills (L3 fills itself, L4 is the source)."""

    keeps_fetched = False

    def holds(self, ref: ChunkRef) -> bool:
        return False

    async def finds(self, ref: ChunkRef) -> bool:
        return False

    async def keep(self, ref: ChunkRef, raw: memoryview) -> None:
        """Nothing kept."""
