"""The Tier contract (blobsdk/tiers/base.py), checked the same way for every tier.

What every tier must do, seen only through the protocol (name, stats, fetch, fill, flush,
peek, extra_stats, async with / aclose):

- ``fetch`` of a chunk it holds returns that chunk's exact raw bytes as a memoryview (for
  plain and lz4 chunks alike) and counts one hit of ``raw_length`` bytes.
- ``fetch`` of a chunk it does not hold returns None and counts one miss; the last tier
  (``last = True``, L4) raises BlockNotFound instead (and still counts the miss).
- A stored copy that fails its checksum is never returned: it is counted in
  ``stats.corrupt`` and the fetch misses (the last tier raises CorruptData); a tier that
  keeps copies drops the bad one, so the next fetch is a plain miss.  L1 holds only bytes
  verified before they were filled, so it has no copy to corrupt.
- ``fill`` counts neither hit nor miss.  A tier that keeps fills (``keeps_fills``) serves a
  fill once ``flush`` returned; the others ignore fills.  ``flush`` always returns.
- ``holds`` counts nothing; a tier that keeps fills holds a chunk once ``keep`` returned
  (no flush needed) and serves it; the others never hold one and ignore ``keep``.  ``finds``
  of a tier alone (nothing else sharing it) answers as ``holds`` and counts nothing.
- ``peek`` never awaits and never counts a miss; a tier with ``peeks = True`` (L1) answers a
  chunk it holds with its bytes and a hit, the others always answer None ("call fetch").
- ``async with tier`` gives the tier itself, ready to serve; ``aclose`` twice, or after
  leaving, is harmless.  ``stats.as_dict()`` has exactly the TierStats keys, zero on
  a new tier; ``extra_stats()`` is a dict of numbers with the tier's documented keys.

Subclass :class:`TierTests` in a ``test_*.py`` module, set its flags, and give it an async
fixture ``harness`` returning a :class:`Harness`: the tier, not yet entered, and the hooks
that put chunks where it reads them and damage its copies.  The suite enters the tier with
``async with`` (which starts what it owns) and leaves it at the end of each test.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal, Protocol

import pytest

from blobsdk.chunks.codec import decode_chunk
from blobsdk.errors import BlockNotFound, CorruptData
from blobsdk.tiers.base import Tier
from blobsdk.wire import ChunkRef
from tests.block_fixtures import Chunks, pack

Codec = Literal["none", "lz4"]
STATS_KEYS = {"hits", "misses", "bytes", "corrupt", "errors", "p50_ms", "p99_ms"}
CHUNK = 12_000


async def decode(ref: ChunkRef, stored: memoryview) -> memoryview:
    """The real Decoder: decompress if lz4 and check the checksum (BadCopy if it fails)."""
    return decode_chunk(ref, stored)


def payload(seed: int, size: int = CHUNK) -> bytes:
    """Half random, half repetitive bytes, distinct per ``seed``: lz4 shrinks them, and an
    offset or key mix-up cannot pass."""
    rng = random.Random(seed)
    return rng.randbytes(size // 2) + bytes([seed % 256]) * (size - size // 2)


def flip_byte(path: Path, at: int) -> None:
    """XOR the byte at ``at`` of the file ``path``."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


class Harness(Protocol):
    """What a subclass provides for its tier."""

    tier: Tier

    async def hold(self, chunks: Chunks) -> None:
        """Put ``chunks`` where the tier reads them, without going through ``fill``."""
        ...

    async def corrupt(self, ref: ChunkRef) -> None:
        """Damage every copy of held chunk ``ref`` that the tier may read."""
        ...


def counts(tier: Tier) -> tuple[int, int, int, int]:
    """(hits, misses, bytes, corrupt); every hit is in the latency histogram too."""
    s = tier.stats
    assert s.histogram().count == s.hits
    return s.hits, s.misses, s.bytes, s.corrupt


class TierTests:
    """Every tier passes these.  Fixture ``harness``: see the module docstring."""

    name: str  # the tier's key in client.stats()
    last = False  # the last tier raises instead of missing
    keeps_fills = False  # fills are served after flush()
    peeks = False  # peek() answers held chunks synchronously
    no_stored_copy: str | None = None  # why the corrupt-copy test does not apply, if it does not
    extra_keys: frozenset[str] = frozenset()  # documented extra_stats() keys
    extra_prefixes: tuple[str, ...] = ()  # families of further extra_stats() keys

    @pytest.fixture
    async def tier(self, harness: Harness) -> AsyncIterator[Tier]:
        async with harness.tier as tier:
            yield tier

    async def held(self, harness: Harness, *raws: bytes, codec: Codec = "none") -> list[ChunkRef]:
        chunks = pack(raws, codec)
        await harness.hold(chunks)
        return chunks.refs

    async def missed(self, tier: Tier, ref: ChunkRef, error: type[Exception] = BlockNotFound) -> None:
        """Fetch ``ref`` and check the tier does not serve it (the last tier raises ``error``)."""
        if self.last:
            with pytest.raises(error):
                await tier.fetch(ref, decode)
        else:
            assert await tier.fetch(ref, decode) is None

    # --- identity and stats ---------------------------------------------------------------

    async def test_is_a_tier_with_its_name(self, tier: Tier) -> None:
        assert isinstance(tier, Tier)
        assert tier.name == self.name

    async def test_stats_have_the_tier_stats_keys_all_zero_on_a_new_tier(self, tier: Tier) -> None:
        stats = tier.stats.as_dict()
        assert set(stats) == STATS_KEYS
        assert all(value == 0 for value in stats.values()), stats

    async def test_extra_stats_are_numbers_under_the_documented_keys(self, tier: Tier) -> None:
        extra = tier.extra_stats()
        assert isinstance(extra, dict)
        assert self.extra_keys <= set(extra), f"missing {self.extra_keys - set(extra)}"
        unknown = {k for k in set(extra) - self.extra_keys if not k.startswith(self.extra_prefixes)}
        assert not unknown, f"undocumented extra_stats keys {unknown}"
        assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in extra.values()), extra

    # --- fetch ------------------------------------------------------------------------------

    @pytest.mark.parametrize("codec", ["none", "lz4"])
    async def test_a_held_chunk_is_served_and_counted_as_a_hit(self, harness: Harness, tier: Tier, codec: Codec) -> None:
        raw = payload(1)
        (ref,) = await self.held(harness, raw, codec=codec)
        assert ref.codec == codec
        got = await tier.fetch(ref, decode)
        assert isinstance(got, memoryview) and bytes(got) == raw
        assert counts(tier) == (1, 0, len(raw), 0)

    async def test_each_chunk_of_a_block_is_served_as_itself(self, harness: Harness, tier: Tier) -> None:
        raws = [payload(seed, size) for seed, size in ((2, 5000), (3, 1), (4, 20_000))]
        refs = await self.held(harness, *raws, codec="lz4")
        for ref, raw in reversed(list(zip(refs, raws, strict=True))):
            assert bytes(await tier.fetch(ref, decode)) == raw
        assert counts(tier) == (3, 0, sum(map(len, raws)), 0)

    async def test_a_chunk_it_does_not_hold_is_a_miss(self, harness: Harness, tier: Tier) -> None:
        await self.held(harness, payload(5))  # something else is there
        (absent,) = pack([payload(6)]).refs
        await self.missed(tier, absent)
        assert counts(tier) == (0, 1, 0, 0)

    @pytest.mark.parametrize("codec", ["none", "lz4"])
    async def test_a_corrupt_copy_is_counted_and_never_returned(self, harness: Harness, tier: Tier, codec: Codec) -> None:
        if self.no_stored_copy:
            pytest.skip(self.no_stored_copy)
        (ref,) = await self.held(harness, payload(7), codec=codec)
        await harness.corrupt(ref)
        await self.missed(tier, ref, CorruptData)
        hits, misses, nbytes, corrupt = counts(tier)
        assert (hits, misses, nbytes) == (0, 1, 0) and corrupt >= 1
        if self.keeps_fills:  # its copy was dropped: now a plain miss
            await self.missed(tier, ref)
            assert counts(tier) == (0, 2, 0, corrupt)

    # --- fill and flush ----------------------------------------------------------------------

    async def test_fill_counts_neither_hit_nor_miss(self, tier: Tier) -> None:
        (ref,) = pack([payload(8)]).refs
        await tier.fill(ref, memoryview(payload(8)))
        await tier.flush()
        assert counts(tier) == (0, 0, 0, 0)

    async def test_a_fill_is_served_after_flush(self, tier: Tier) -> None:
        if not self.keeps_fills:
            pytest.skip(f"{self.name} ignores fills (see test_a_fill_is_ignored)")
        chunks = pack([payload(9), payload(10)])
        for ref, raw in zip(chunks.refs, chunks.raws, strict=True):
            await tier.fill(ref, memoryview(raw))
        await tier.flush()
        assert [bytes(await tier.fetch(ref, decode)) for ref in chunks.refs] == chunks.raws
        assert counts(tier) == (2, 0, sum(map(len, chunks.raws)), 0)

    async def test_a_fill_is_ignored(self, tier: Tier) -> None:
        if self.keeps_fills:
            pytest.skip(f"{self.name} keeps fills (see test_a_fill_is_served_after_flush)")
        (ref,) = pack([payload(11)]).refs  # not in the tier: only the fill could make it a hit
        await tier.fill(ref, memoryview(payload(11)))
        await tier.flush()
        await self.missed(tier, ref)
        assert counts(tier) == (0, 1, 0, 0)

    async def test_flush_returns_with_and_without_fills(self, tier: Tier) -> None:
        chunks = pack([payload(seed) for seed in range(12, 20)])
        async with asyncio.timeout(10):  # a flush that never returns fails here, not hangs
            await tier.flush()
            for ref, raw in zip(chunks.refs, chunks.raws, strict=True):
                await tier.fill(ref, memoryview(raw))
            await tier.flush()
            await tier.flush()

    # --- holds and keep (deep prefetch) -------------------------------------------------------

    async def test_keep_stores_before_it_returns_and_holds_says_so(self, tier: Tier) -> None:
        chunks = pack([payload(22), payload(23)])
        assert not any(tier.holds(ref) for ref in chunks.refs)
        await tier.keep(chunks.refs[0], memoryview(chunks.raws[0]))
        assert counts(tier) == (0, 0, 0, 0)
        if self.keeps_fills:
            assert tier.holds(chunks.refs[0]) and not tier.holds(chunks.refs[1])
            assert bytes(await tier.fetch(chunks.refs[0], decode)) == chunks.raws[0]
        else:
            assert not tier.holds(chunks.refs[0])
            await self.missed(tier, chunks.refs[0])

    async def test_finds_of_a_tier_alone_answers_as_holds_and_counts_nothing(self, tier: Tier) -> None:
        chunks = pack([payload(24), payload(25)])
        await tier.keep(chunks.refs[0], memoryview(chunks.raws[0]))
        assert [await tier.finds(ref) for ref in chunks.refs] == [tier.holds(ref) for ref in chunks.refs]
        assert [tier.holds(ref) for ref in chunks.refs] == [self.keeps_fills, False]
        assert counts(tier) == (0, 0, 0, 0)

    # --- peek --------------------------------------------------------------------------------

    async def test_peek_of_an_absent_chunk_is_none_and_counts_nothing(self, tier: Tier) -> None:
        (ref,) = pack([payload(20)]).refs
        assert tier.peek(ref) is None
        assert counts(tier) == (0, 0, 0, 0)

    async def test_peek_of_a_held_chunk_answers_without_an_await(self, harness: Harness, tier: Tier) -> None:
        raw = payload(21)
        (ref,) = await self.held(harness, raw)
        got = tier.peek(ref)
        assert not inspect.isawaitable(got)
        if self.peeks:
            assert isinstance(got, memoryview) and bytes(got) == raw
            assert counts(tier) == (1, 0, len(raw), 0)
        else:
            assert got is None  # "call fetch", which serves it
            assert counts(tier) == (0, 0, 0, 0)
            assert bytes(await tier.fetch(ref, decode)) == raw

    # --- close -------------------------------------------------------------------------------

    async def test_async_with_yields_the_tier_itself_ready_to_serve(self, harness: Harness) -> None:
        raw = payload(23)
        async with harness.tier as tier:
            assert tier is harness.tier
            (ref,) = await self.held(harness, raw)
            assert bytes(await tier.fetch(ref, decode)) == raw
        await tier.aclose()  # after leaving: harmless

    async def test_aclose_twice_is_harmless(self, harness: Harness, tier: Tier) -> None:
        raw = payload(22)
        (ref,) = await self.held(harness, raw)
        assert bytes(await tier.fetch(ref, decode)) == raw  # closing a tier that did work
        await tier.aclose()
        await tier.aclose()
