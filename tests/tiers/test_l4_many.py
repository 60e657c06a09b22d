"""L4Tier.fetch_many_into: a group of chunks of one block read straight into the caller's
memory in one request, from a lone replica that reads spans."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from blobsdk.chunks.codec import verify_windows
from blobsdk.errors import BlockNotFound, CorruptData
from blobsdk.sources import HttpBlockStore, LocalBlockStore, ReplicatedBlockStore
from blobsdk.tail.health import Reason
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.tiers.base import DirectTier, Piece
from blobsdk.wire import ChunkRef
from servers.blockstore import make_app
from tests.block_fixtures import pack_chunks
from tests.helpers import running_app


def pieces_of(refs: list[ChunkRef], cuts: int = 1) -> list[Piece]:
    """A piece per ref, its bytes going into ``cuts`` fresh windows."""
    out = []
    for ref in refs:
        bounds = [ref.raw_length * i // cuts for i in range(cuts + 1)]
        out.append(Piece(ref, tuple(memoryview(bytearray(b - a)) for a, b in itertools.pairwise(bounds))))
    return out


def landed(piece: Piece) -> bytes:
    return b"".join(bytes(w) for w in piece.windows)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalBlockStore]:
    async with LocalBlockStore(tmp_path / "blocks") as blocks:
        yield blocks


async def test_a_group_lands_in_its_windows_counted_per_chunk(local: LocalBlockStore) -> None:
    raws = [os.urandom(n) for n in (1000, 5000, 1, 70_000)]
    refs = await pack_chunks(local, raws)
    tier = L4Tier(ReplicaReader(local))
    assert isinstance(tier, DirectTier)
    pieces = pieces_of(refs, cuts=1) + pieces_of(refs[1:2], cuts=3)  # a chunk twice, the second time in 3 windows
    assert await tier.fetch_many_into(pieces, verify_windows)
    assert [landed(p) for p in pieces] == [*raws, raws[1]]
    assert (tier.stats.hits, tier.stats.bytes, tier.stats.misses, tier.stats.corrupt) == (5, 81_001, 0, 0)
    assert tier.hedger.counts.primaries == 1  # one request for the group
    assert await tier.fetch_many_into([], verify_windows)


async def test_a_bad_chunk_in_a_group_raises_as_a_lone_read_would(local: LocalBlockStore) -> None:
    raws = [os.urandom(4000) for _ in range(4)]
    refs = await pack_chunks(local, raws)
    (path,) = (p for p in local.root.rglob(refs[0].block_id))
    data = bytearray(path.read_bytes())
    data[refs[2].offset + 7] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(data)
    tier = L4Tier(ReplicaReader(local))
    pieces = pieces_of(refs)
    with pytest.raises(CorruptData) as info:
        await tier.fetch_many_into(pieces, verify_windows)
    bad = refs[2]
    assert str(info.value) == (
        f"chunk {bad.key}: no replica returned bytes matching its checksum "
        f"(chunk {bad.key} at block {bad.block_id}+{bad.offset}: checksum mismatch)"
    )
    assert (tier.stats.hits, tier.stats.misses, tier.stats.corrupt) == (3, 1, 1)
    assert tier.health.has(local.name, Reason.BAD_BYTES)
    assert await tier.fetch_many_into(pieces_of(refs[:2]), verify_windows)  # a verified group clears it
    assert not tier.health.has(local.name, Reason.BAD_BYTES)


async def test_a_block_gone_is_block_not_found(local: LocalBlockStore) -> None:
    refs = await pack_chunks(local, [b"a" * 100, b"b" * 100])
    await local.delete_block(refs[0].block_id)
    tier = L4Tier(ReplicaReader(local))
    gone = rf"^block {refs[0].block_id} is gone from every replica \(blob deleted or replaced\?\)$"
    with pytest.raises(BlockNotFound, match=gone):
        await tier.fetch_many_into(pieces_of(refs), verify_windows)
    assert (tier.stats.hits, tier.stats.misses, tier.stats.errors) == (0, 2, 1)


async def test_what_a_group_cannot_hold_is_refused_with_nothing_written(local: LocalBlockStore) -> None:
    plain = await pack_chunks(local, [os.urandom(3000), os.urandom(3000)])
    (packed,) = await pack_chunks(local, [b"xyz" * 5000], "lz4")
    tier = L4Tier(ReplicaReader(local))
    short = Piece(plain[0], (memoryview(bytearray(2999)),))
    for group in ([short], pieces_of([packed]), [*pieces_of(plain[:1]), *pieces_of([packed])]):
        assert not await tier.fetch_many_into(group, verify_windows)
        assert all(landed(p) == bytes(len(landed(p))) for p in group)
    other_block = await pack_chunks(local, [os.urandom(10)])
    group = pieces_of([plain[0], *other_block])
    assert not await tier.fetch_many_into(group, verify_windows)  # two blocks
    assert tier.stats.hits == 0 and tier.hedger.counts.primaries == 0


async def test_several_replicas_or_one_that_reads_no_spans_keep_the_one_at_a_time_path(tmp_path: Path) -> None:
    async with (
        ReplicatedBlockStore([LocalBlockStore(tmp_path / "r0"), LocalBlockStore(tmp_path / "r1")]) as two,
        aiohttp.ClientSession() as session,
        running_app(make_app(tmp_path / "server")) as url,
    ):
        refs = await pack_chunks(two, [os.urandom(500)])
        await two.settle()
        assert not await L4Tier(ReplicaReader(two)).fetch_many_into(pieces_of(refs), verify_windows)
        http = HttpBlockStore(session, url)
        refs = await pack_chunks(http, [os.urandom(500)])
        tier = L4Tier(ReplicaReader(http))
        pieces = pieces_of(refs)
        assert not await tier.fetch_many_into(pieces, verify_windows)
        assert landed(pieces[0]) == bytes(500) and tier.stats.hits == 0
