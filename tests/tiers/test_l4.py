"""blobsdk/tiers/_l4.py: the durable tier over replicated block servers (real, in-loop)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest

from blobsdk.chunks.codec import decode_chunk
from blobsdk.client import Client
from blobsdk.config import HedgeConfig
from blobsdk.errors import BadCopy, BlockNotFound, CorruptData, Unavailable
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.net.limiter import LimiterRegistry
from blobsdk.sources import HttpBlockStore, ReplicatedBlockStore
from blobsdk.tail.health import Reason
from blobsdk.tail.replicaread import ReplicaReader
from blobsdk.tiers import L4Tier
from blobsdk.tiers.base import Tier
from blobsdk.wire import ChunkRef, Codec
from servers.blockstore import make_app
from tests.block_fixtures import pack_chunks
from tests.helpers import running_app


async def decode(ref: ChunkRef, stored: memoryview) -> memoryview:
    return decode_chunk(ref, stored)


class Replicas:
    """In-loop block servers over tmp dirs, each stoppable; ``blocks`` reads them in order."""

    def __init__(self, tmp: Path, session: aiohttp.ClientSession, stack: AsyncExitStack) -> None:
        self.tmp, self.session, self.stack = tmp, session, stack
        self.stacks: list[AsyncExitStack] = []
        self.urls: list[str] = []
        self.blocks: ReplicatedBlockStore | None = None

    async def start(self, n: int) -> ReplicatedBlockStore:
        for i in range(n):
            stack = AsyncExitStack()
            self.urls.append(await stack.enter_async_context(running_app(make_app(self.tmp / f"r{i}"))))
            self.stacks.append(stack)
            self.stack.push_async_callback(stack.aclose)
        self.blocks = ReplicatedBlockStore([HttpBlockStore(self.session, url) for url in self.urls])
        return self.blocks

    async def stop(self, i: int) -> None:
        await self.stacks[i].aclose()

    def corrupt(self, i: int, ref: ChunkRef) -> None:
        """Flip one byte of ``ref``'s stored bytes in replica ``i``'s block file."""
        (path,) = (self.tmp / f"r{i}").rglob(ref.block_id)
        with open(path, "r+b") as f:
            f.seek(ref.offset + ref.length // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))


async def pack(blocks: ReplicatedBlockStore, raws: list[bytes], compression: Codec = "none") -> list[ChunkRef]:
    """Write ``raws`` as the chunks of one new block; their refs."""
    refs = await pack_chunks(blocks, raws, compression)
    await blocks.settle()  # a majority acknowledged: let the last copy land before a test inspects each replica
    return refs


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    async with aiohttp.ClientSession() as session, AsyncExitStack() as stack:
        yield Replicas(tmp_path, session, stack)


async def test_serves_verified_bytes_of_plain_and_lz4_chunks(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    raws = [os.urandom(5000), b"abc" * 20_000]
    refs = await pack(blocks, raws, "auto")
    assert [r.codec for r in refs] == ["none", "lz4"]
    tier = L4Tier(ReplicaReader(blocks))
    assert isinstance(tier, Tier) and tier.name == "l4"
    for ref, raw in zip(refs, raws, strict=True):
        assert bytes(await tier.fetch(ref, decode)) == raw
    assert (tier.stats.hits, tier.stats.bytes, tier.stats.corrupt, tier.stats.errors) == (2, 65_000, 0, 0)


async def test_fetch_stored_returns_the_copy_it_read(replicas: Replicas) -> None:
    blocks = await replicas.start(1)
    (ref,) = await pack(blocks, [os.urandom(3000)])
    stored, raw = await L4Tier(ReplicaReader(blocks)).fetch_stored(ref, decode)
    assert raw.obj is stored.obj  # uncompressed: the raw bytes are the stored copy itself


async def test_a_corrupt_replica_fails_over_to_a_good_one(replicas: Replicas) -> None:
    blocks = await replicas.start(3)
    raws = [os.urandom(4000), b"xyz" * 9000]
    refs = await pack(blocks, raws, "auto")
    tier = L4Tier(ReplicaReader(blocks, hedge=HedgeConfig(enabled=False)))
    first_two = tier.candidates(refs[0].key)[:2]  # so the first chunk tries both bad copies
    for ref in refs:
        for bad in first_two:
            replicas.corrupt(blocks.replicas.index(bad), ref)
    (good,) = [r for r in blocks.replicas if r not in first_two]
    bad_reads = 0
    for ref, raw in zip(refs, raws, strict=True):
        # The order at the moment of the fetch: a bad copy demotes its replica for the next.
        bad_reads += tier.candidates(ref.key).index(good)
        assert bytes(await tier.fetch(ref, decode)) == raw
    assert bad_reads >= 2
    assert (tier.stats.hits, tier.stats.corrupt, tier.stats.errors) == (2, bad_reads, 0)


async def test_candidates_spread_over_replicas_and_demote_a_slow_one(replicas: Replicas) -> None:
    blocks = await replicas.start(3)
    tier = L4Tier(ReplicaReader(blocks))
    keys = [f"{i:032x}" for i in range(300)]
    firsts = [tier.candidates(k)[0].name for k in keys]
    assert all(firsts.count(r.name) > 60 for r in blocks.replicas)  # ~100 each
    slow = blocks.replicas[0].name
    for _ in range(20):
        tier.hedger.latency.record(slow, 0.050)
        for r in blocks.replicas[1:]:
            tier.hedger.latency.record(r.name, 0.002)
    assert all(tier.candidates(k)[-1].name == slow for k in keys)


async def test_the_least_loaded_replica_is_tried_first(replicas: Replicas) -> None:
    """On a busy HDD tier a chunk's rendezvous-first replica may have the longest queue."""
    blocks = await replicas.start(3)
    limiters = LimiterRegistry()
    tier = L4Tier(ReplicaReader(blocks, limiters=limiters))
    keys = [f"{i:032x}" for i in range(60)]
    at_rest = {k: [r.name for r in tier.candidates(k)] for k in keys}
    busy = blocks.replicas[0].name
    async with AsyncExitStack() as held:
        for _ in range(2):  # two reads in flight at the busy one, one at the next
            await held.enter_async_context(limiters.get(busy).acquire())
        await held.enter_async_context(limiters.get(blocks.replicas[1].name).acquire())
        assert limiters.load(busy) == 2
        order = [r.name for r in reversed(blocks.replicas)]  # 0, 1 and 2 reads in flight
        for k in keys:
            assert [r.name for r in tier.candidates(k)] == order  # by load, whatever the key
    assert {k: [r.name for r in tier.candidates(k)] for k in keys} == at_rest  # idle again: rendezvous


async def test_every_copy_corrupt_is_corrupt_data(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    (ref,) = await pack(blocks, [os.urandom(4000)])
    replicas.corrupt(0, ref)
    replicas.corrupt(1, ref)
    tier = L4Tier(ReplicaReader(blocks))
    with pytest.raises(CorruptData, match="no replica returned bytes matching its checksum") as caught:
        await tier.fetch(ref, decode)
    assert not isinstance(caught.value, BadCopy)
    assert (tier.stats.hits, tier.stats.misses, tier.stats.corrupt) == (0, 1, 2)


async def test_a_corrupt_copy_wins_over_other_failures(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    (ref,) = await pack(blocks, [os.urandom(4000)])
    replicas.corrupt(0, ref)
    await replicas.stop(1)
    with pytest.raises(CorruptData):
        await L4Tier(ReplicaReader(blocks)).fetch(ref, decode)


async def test_a_block_gone_everywhere_is_block_not_found(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    (ref,) = await pack(blocks, [os.urandom(100)])
    await blocks.delete_block(ref.block_id)
    tier = L4Tier(ReplicaReader(blocks))
    with pytest.raises(BlockNotFound):
        await tier.fetch(ref, decode)
    assert tier.stats.errors == 2


async def test_a_dead_replica_fails_over_and_all_dead_is_unavailable(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    (ref,) = await pack(blocks, [os.urandom(1000)])
    tier = L4Tier(ReplicaReader(blocks))
    first = list(blocks.replicas).index(tier.candidates(ref.key)[0])
    await replicas.stop(first)
    assert len(await tier.fetch(ref, decode)) == 1000
    assert (tier.stats.hits, tier.stats.errors) == (1, 1)
    await replicas.stop(1 - first)
    with pytest.raises(Unavailable):
        await tier.fetch(ref, decode)


async def test_a_replica_that_lost_the_block_fails_over(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    raw = os.urandom(100)
    (ref,) = await pack(blocks, [raw])
    tier = L4Tier(ReplicaReader(blocks, hedge=HedgeConfig(enabled=False)))
    await tier.candidates(ref.key)[0].delete_block(ref.block_id)
    assert bytes(await tier.fetch(ref, decode)) == raw
    assert (tier.stats.hits, tier.stats.errors) == (1, 1)


async def test_missing_on_one_and_dead_on_the_other_is_unavailable(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    (ref,) = await pack(blocks, [os.urandom(100)])
    await HttpBlockStore(replicas.session, replicas.urls[1]).delete_block(ref.block_id)
    await replicas.stop(0)
    with pytest.raises(Unavailable):
        await L4Tier(ReplicaReader(blocks)).fetch(ref, decode)


async def test_fill_is_a_no_op(replicas: Replicas) -> None:
    blocks = await replicas.start(1)
    (ref,) = await pack(blocks, [b"z" * 10])
    tier = L4Tier(ReplicaReader(blocks))
    await tier.fill(ref, memoryview(b"other bytes"))
    assert bytes(await tier.fetch(ref, decode)) == b"z" * 10
    await tier.aclose()


async def test_a_replica_that_served_a_bad_copy_is_tried_last(replicas: Replicas) -> None:
    blocks = await replicas.start(3)
    raws = [os.urandom(1000) for _ in range(120)]  # 40 gave fewer than 6 firsts on replica 0 once in ~300 runs
    refs = await pack(blocks, raws)
    tier = L4Tier(ReplicaReader(blocks, hedge=HedgeConfig(enabled=False)))
    bad = blocks.replicas[0]
    firsts = [r for r in refs if tier.candidates(r.key)[0] is bad][:6]
    assert len(firsts) == 6
    for ref in refs:
        replicas.corrupt(0, ref)
    for ref in firsts:
        assert bytes(await tier.fetch(ref, decode)) == raws[refs.index(ref)]
    assert tier.stats.corrupt == 1  # was 6: the corrupt replica stayed first for every read
    assert all(tier.candidates(r.key)[-1] is bad for r in refs)
    assert tier.extra_stats()["replicas_demoted"] == 1 and "repairs_queued" not in tier.extra_stats()  # no metadata
    tier.health.clear(bad.name, Reason.BAD_BYTES)
    assert tier.candidates(firsts[0].key)[0] is bad


class Reports:
    """A BlockReport that keeps what it was told."""

    def __init__(self) -> None:
        self.blocks: list[str] = []

    def report(self, block_id: str) -> None:
        self.blocks.append(block_id)


async def test_the_tier_reports_a_block_it_skipped_a_bad_or_missing_copy_of(replicas: Replicas) -> None:
    blocks = await replicas.start(2)
    refs = await pack(blocks, [os.urandom(1000) for _ in range(8)])
    reports = Reports()
    tier = L4Tier(ReplicaReader(blocks, hedge=HedgeConfig(enabled=False), report=reports))
    await tier.fetch(refs[0], decode)
    assert reports.blocks == []  # the first copy verified: nothing to mend
    first = tier.candidates(refs[1].key)[0]
    replicas.corrupt(blocks.replicas.index(first), refs[1])
    await tier.fetch(refs[1], decode)
    assert reports.blocks == [refs[1].block_id]
    await tier.aclose()


async def test_the_client_owns_its_repairer_from_start_to_close(replicas: Replicas, tmp_path: Path) -> None:
    blocks = await replicas.start(2)
    async with SqliteMetadataStore(tmp_path / "meta.sqlite") as metadata:
        async with Client.from_stores(metadata, blocks) as client:
            repairer = client._open.repairer
            assert repairer is not None and repairer.under_replicated is blocks.under_replicated
            tasks = [repairer._task, repairer._ledger_task]
            assert all(task is not None and not task.done() for task in tasks)
            l4 = client._open.readpath.tiers[-1]
            assert isinstance(l4, L4Tier) and l4.engine._report is repairer  # what the tier's reads report to
        assert all(task is not None and task.done() for task in tasks) and repairer._task is None
        async with Client.from_stores(metadata, blocks.replicas[0]) as client:
            assert client._open.repairer is None  # one replica: nothing to mend a copy from


def test_give_up_keeps_a_changed_sources_message_when_every_replica_lost_the_block():
    from blobsdk.errors import BlockNotFound, SourceChanged
    from blobsdk.tail.replicaread import give_up

    ref = ChunkRef(block_id="f" + "0" * 31, offset=0, length=1, raw_length=1, checksum=0)
    changed = SourceChanged("s3://lake/k changed since it was indexed")
    assert str(give_up(ref, [BlockNotFound("gone"), changed])) == "s3://lake/k changed since it was indexed"
    assert type(give_up(ref, [BlockNotFound("gone"), changed])) is SourceChanged
    assert type(give_up(ref, [BlockNotFound("gone")])) is BlockNotFound
