"""The tiered read path through a real client: L1 memory, L2 disk, L4 local blocks."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading

import msgspec
import pytest
import xxhash

import blobsdk
from blobsdk.cache import DiskCache
from blobsdk.config import L1Config, L2Config, ReadConfig, WriteConfig
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.runtime.buffers import BufferPool
from blobsdk.sources import LocalBlockStore, ReplicatedBlockStore
from blobsdk.tiers import L2Tier
from blobsdk.wire import ChunkRef
from tests.block_fixtures import OneAtATime
from tests.helpers import stored_files

SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)
NO_L1 = L1Config(capacity_bytes=0)


def data_of(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


class CountingBlocks(LocalBlockStore):
    """A local block store that counts chunk reads (what reached L4)."""

    reads = 0

    async def read_into(self, block_id, offset, out, *, call=None):
        self.reads += 1
        await asyncio.sleep(0.01)  # long enough for concurrent readers to pile up
        await super().read_into(block_id, offset, out)


def l2_files(root):
    return [f for f in stored_files(root) if not f.name.endswith(".tmp")]


async def l2_flush(client):
    await client.flush()


async def test_second_read_hits_l1(tmp_path):
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        data = data_of(300_000)
        await c.put("/b/x", data)
        assert await c.get("/b/x") == data
        first = c.stats()
        assert first["l4"]["hits"] == 5 and first["l1"]["hits"] == 0 and first["l1"]["misses"] == 5
        assert await c.get("/b/x") == data
        assert await c.get("/b/x", offset=70_000, length=1000) == data[70_000:71_000]
        second = c.stats()
        assert second["l4"]["hits"] == 5 and second["l1"]["hits"] == 6
        assert second["l2"]["enabled"] is False and second["l3"]["enabled"] is False


async def test_l2_serves_after_l1_is_gone_and_survives_restart(tmp_path):
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=10 << 20)
    data = data_of(300_000, 1)
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l1=NO_L1, l2=l2) as c:
        await c.put("/b/x", data)
        assert await c.get("/b/x") == data
        await l2_flush(c)
        assert len(l2_files(tmp_path / "l2")) == 5
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l1=NO_L1, l2=l2) as c:
        assert await c.get("/b/x") == data
        stats = c.stats()
        assert stats["l2"]["hits"] == 5 and stats["l4"]["hits"] == 0


@pytest.mark.parametrize("damage", ["flip", "truncate"])
async def test_damaged_l2_file_is_detected_deleted_and_refetched(tmp_path, damage):
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=10 << 20)
    data = data_of(200_000, 2)
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l1=NO_L1, l2=l2) as c:
        await c.put("/b/x", data)
        await c.get("/b/x")
        await l2_flush(c)
        victim = min(l2_files(tmp_path / "l2"))
        raw = bytearray(victim.read_bytes())
        if damage == "flip":
            raw[-5] ^= 0xFF
        else:
            del raw[len(raw) // 2 :]
        victim.write_bytes(raw)
        assert await c.get("/b/x") == data
        stats = c.stats()
        assert stats["l4"]["hits"] == 4 + 1  # the first read, then the damaged chunk again
        assert stats["l2"]["hits"] == 3


async def test_full_l2_disk_still_serves_reads(tmp_path):
    full = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=10 << 20, min_free_ratio=0.99999)
    data = data_of(200_000, 3)
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l1=NO_L1, l2=full) as c:
        await c.put("/b/x", data)
        for _ in range(2):
            assert await c.get("/b/x") == data
            await l2_flush(c)
        assert c.stats()["l2"]["hits"] == 0
    assert l2_files(tmp_path / "l2") == []


async def test_caches_smaller_than_one_chunk(tmp_path):
    tiny_l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=1000)
    data = data_of(300_000, 4)
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l1=L1Config(capacity_bytes=1000), l2=tiny_l2) as c:
        await c.put("/b/x", data)
        for _ in range(3):
            assert await c.get("/b/x") == data


async def test_eviction_racing_readers_returns_correct_bytes(tmp_path):
    blobs = {f"/b/{i}": data_of(70_000 + i, i) for i in range(30)}
    async with blobsdk.Client.local(tmp_path, write=SMALL, l1=L1Config(capacity_bytes=300_000)) as c:
        await c.put_many(blobs.items())
        paths = list(blobs) * 6
        random.Random(5).shuffle(paths)
        for i in range(0, len(paths), 12):  # batches of concurrent readers while L1 churns
            batch = paths[i : i + 12]
            results = await asyncio.gather(*(c.get(p) for p in batch))
            assert all(r == blobs[p] for p, r in zip(batch, results, strict=True))
        stats = c.stats()["l1"]
        assert stats["hits"] > 0 and stats["misses"] > 0


async def test_fifty_concurrent_readers_of_a_cold_chunk_cause_one_upstream_read(tmp_path):
    async with (
        SqliteMetadataStore(tmp_path / "m.sqlite") as meta,
        CountingBlocks(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=NO_L1) as c,
    ):
        data = data_of(50_000, 6)  # one chunk
        await c.put("/b/one", data)
        results = await asyncio.gather(*(c.get("/b/one") for _ in range(50)))
        assert all(r == data for r in results)
        assert blocks.reads == 1


async def test_cancelled_reader_leaves_the_fetch_to_the_others(tmp_path):
    async with (
        SqliteMetadataStore(tmp_path / "m.sqlite") as meta,
        CountingBlocks(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=NO_L1) as c,
    ):
        data = data_of(50_000, 7)
        await c.put("/b/one", data)
        first = asyncio.create_task(c.get("/b/one"))
        second = asyncio.create_task(c.get("/b/one"))
        await asyncio.sleep(0)
        first.cancel()
        assert await second == data
        with pytest.raises(asyncio.CancelledError):
            await first
        assert blocks.reads == 1


async def test_plan_cache_staleness_is_bounded_by_its_ttl(tmp_path):
    read = ReadConfig(plan_cache_ttl_seconds=0.3)
    async with (
        blobsdk.Client.local(tmp_path, write=SMALL, read=read) as a,
        blobsdk.Client.local(tmp_path, write=SMALL, read=read) as b,
    ):
        await a.put("/b/p", b"one")
        assert await b.get("/b/p") == b"one"
        await a.put("/b/p", b"two")
        assert await a.get("/b/p") == b"two"  # own writes: at once
        assert await b.get("/b/p") == b"one"  # another client's write: within the TTL
        await asyncio.sleep(0.35)
        assert await b.get("/b/p") == b"two"
        await a.delete("/b/p")
        with pytest.raises(blobsdk.BlobNotFound):
            await a.get("/b/p")
        assert b.stats()["plan"]["hits"] >= 1


async def test_plan_cache_disabled(tmp_path):
    read = ReadConfig(plan_cache_ttl_seconds=0)
    async with blobsdk.Client.local(tmp_path, read=read) as a, blobsdk.Client.local(tmp_path, read=read) as b:
        await a.put("/b/p", b"one")
        assert await b.get("/b/p") == b"one"
        await a.put("/b/p", b"two")
        assert await b.get("/b/p") == b"two"
        assert b.stats()["plan"]["entries"] == 0


async def test_compressed_chunks_through_every_tier(tmp_path):
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=10 << 20)
    data = b"compressible text " * 20_000
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l2=l2) as c:
        await c.put("/b/z", data)
        assert await c.get("/b/z") == data
        await l2_flush(c)
    async with blobsdk.Client.local(tmp_path / "d", write=SMALL, l2=l2) as c:
        assert await c.get("/b/z", offset=1000, length=100_000) == data[1000:101_000]
        assert c.stats()["l2"]["hits"] == 2 and c.stats()["l4"]["hits"] == 0


@pytest.mark.parametrize("l1", [NO_L1, L1Config()])
async def test_results_never_share_a_buffer(tmp_path, l1):
    """Whole-chunk reads may hand over the fetched buffer itself, but only to a sole holder:
    mutating one result never changes another reader's, nor what the caches serve."""
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=10 << 20)
    async with (
        SqliteMetadataStore(tmp_path / "m.sqlite") as meta,
        CountingBlocks(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=l1, l2=l2) as c,
    ):
        data = data_of(60_000, 8)  # one chunk
        await c.put("/b/one", data)
        first, second = await asyncio.gather(c.get("/b/one"), c.get("/b/one"))
        assert first is not second and first == second == data
        first[0] ^= 0xFF
        assert second == data
        await c.flush()
        third = await c.get("/b/one")
        third[1] ^= 0xFF
        assert await c.get("/b/one") == data


async def test_l2_write_behind_drops_fills_past_its_byte_bound(tmp_path):
    raw = memoryview(data_of(60_000, 9))
    refs = [
        ChunkRef(block_id=f"{i:032x}", offset=0, length=60_000, raw_length=60_000, checksum=xxhash.xxh3_64_intdigest(raw))
        for i in range(2)
    ]
    async with L2Tier(DiskCache(tmp_path, capacity_bytes=10 << 20), queue_bytes=100_000) as tier:
        cache = tier.cache
        await tier.fill(refs[0], raw)
        await tier.fill(refs[1], raw)  # 120,000 bytes would be pending: dropped, never blocking
        assert tier.fills_dropped == 1
        await tier.flush()
        assert cache.contains(refs[0].key) and not cache.contains(refs[1].key)
        await tier.fill(refs[1], raw)  # the queue drained: room again
        await tier.flush()
        assert cache.contains(refs[1].key)


async def test_a_reader_arriving_as_a_fetch_is_abandoned_gets_a_fresh_fetch(tmp_path):
    """The last reader leaving cancels the fetch; a reader that comes right after must not
    inherit that cancellation."""
    async with (
        SqliteMetadataStore(tmp_path / "m.sqlite") as meta,
        CountingBlocks(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=NO_L1) as c,
    ):
        data = data_of(50_000, 10)
        await c.put("/b/one", data)
        first = asyncio.create_task(c.get("/b/one"))
        await asyncio.sleep(0.001)
        first.cancel()
        second = asyncio.create_task(c.get("/b/one"))  # joins before the cancel lands
        assert await second == data
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_a_tier_that_cannot_be_built_closes_the_ones_before_it(tmp_path):
    l2 = L2Config(dir=str(tmp_path / "l2"), capacity_bytes=10 << 20)
    bad = blobsdk.ClientConfig(
        api_url="http://127.0.0.1:9", block_urls=("http://127.0.0.1:9",), l2=l2, l3_urls=("http://127.0.0.1:9",)
    )
    l3 = blobsdk.config.L3Config()  # a fresh one: the default instance is shared
    msgspec.structs.force_setattr(l3, "replicas", 0)  # past the config's own check: L3Tier refuses it too
    bad = msgspec.structs.replace(bad, l3=l3)
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        async with blobsdk.Client(bad):
            pass
    await asyncio.sleep(0.05)
    # the L2 cache opened before L3 failed was closed: its disk threads are gone
    assert [t.name for t in threading.enumerate() if t.name.startswith("blobsdk-l2")] == []


class BrokenDisk(DiskCache):
    """A disk cache whose first put fails with an unexpected error (a bug, an OSError)."""

    failed = False

    async def put(self, key, data, **kwargs):
        if not self.failed:
            self.failed = True
            raise RuntimeError("disk on fire")
        return await super().put(key, data, **kwargs)


async def test_an_l2_fill_that_fails_unexpectedly_is_logged_and_counted_and_the_writer_lives_on(tmp_path, caplog):
    raw = memoryview(data_of(1000, 11))
    refs = [
        ChunkRef(block_id=f"{i:032x}", offset=0, length=1000, raw_length=1000, checksum=xxhash.xxh3_64_intdigest(raw))
        for i in range(2)
    ]
    async with L2Tier(BrokenDisk(tmp_path, capacity_bytes=1 << 20), writers=1) as tier:
        await tier.fill(refs[0], raw)
        await asyncio.wait_for(tier.flush(), 5)
        await tier.fill(refs[1], raw)  # the one writer must still be there to write it
        await asyncio.wait_for(tier.flush(), 5)
        assert tier.cache.contains(refs[1].key) and not tier.cache.contains(refs[0].key)
        assert (tier.stats.errors, tier.extra_stats()["fill_failures"]) == (1, 1)
    assert f"L2 fill of chunk {refs[0].key} failed" in caplog.text and "disk on fire" in caplog.text


async def test_l2_counts_each_corrupt_copy_once_under_concurrent_fetches(tmp_path):
    raw = memoryview(data_of(5000, 12))
    refs = [
        ChunkRef(block_id=f"{i:032x}", offset=0, length=5000, raw_length=5000, checksum=xxhash.xxh3_64_intdigest(raw))
        for i in range(8)
    ]
    async with L2Tier(DiskCache(tmp_path, capacity_bytes=1 << 20)) as tier:
        for ref in refs:
            await tier.fill(ref, raw)
        await tier.flush()
        for path in (p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size >= 5000):
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(data)
        results = await asyncio.gather(*(tier.fetch(ref, None) for ref in refs))
    assert results == [None] * 8 and (tier.stats.corrupt, tier.stats.misses) == (8, 8)


async def test_l2_flush_after_close_returns_and_counts_the_queued_fills_dropped(tmp_path):
    raw = memoryview(data_of(5000, 13))
    refs = [
        ChunkRef(block_id=f"{i:032x}", offset=0, length=5000, raw_length=5000, checksum=xxhash.xxh3_64_intdigest(raw))
        for i in range(20)
    ]
    tier = L2Tier(DiskCache(tmp_path, capacity_bytes=1 << 20), writers=1)
    async with tier:
        for ref in refs:
            await tier.fill(ref, raw)
    await asyncio.wait_for(tier.flush(), 5)
    assert tier.fills_dropped > 0 and tier._pending_bytes == 0


async def test_read_into_fills_the_buffer_and_can_leave_l1_alone(tmp_path):
    """``read_into`` (a checkpoint restore's read) with ``fill_memory=False`` fetches every
    chunk once and puts none of them into L1; with the default it fills L1 as ``get`` does."""
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        data = data_of(300_000, 11)
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        out = bytearray(len(data))
        await c._open.readpath.read_into(plan, memoryview(out), fill_memory=False)
        assert out == data
        assert c.stats()["l1"]["cache_entries"] == 0 and c.stats()["l4"]["hits"] == 5
        out[:] = bytes(len(data))
        await c._open.readpath.read_into(plan, memoryview(out))
        assert out == data and c.stats()["l1"]["cache_entries"] == 5 and c.stats()["l4"]["hits"] == 10
        out[:] = bytes(len(data))
        await c._open.readpath.read_into(plan, memoryview(out), fill_memory=False)  # L1 serves, still
        assert out == data and c.stats()["l4"]["hits"] == 10


async def test_read_into_scatters_the_blob_over_a_sequence_of_buffers(tmp_path):
    """A scatter read (a checkpoint restored into the caller's arrays): the blob's bytes go into
    the buffers one after another, a chunk split across two of them included."""
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        data = data_of(300_000, 13)  # 5 chunks of 64 KiB
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        outs = [bytearray(n) for n in (0, 65_536, 100_000, 1, 134_463)]  # 100_000: a chunk and part of the next
        await c._open.readpath.read_into(plan, [memoryview(o) for o in outs], fill_memory=False)
        assert b"".join(outs) == data
        with pytest.raises(blobsdk.BadRequest, match=r"^/b/x: a buffer of 299999 bytes for a blob of 300000$"):
            await c._open.readpath.read_into(plan, [memoryview(o) for o in outs[:-1]] + [memoryview(bytearray(134_462))])


async def test_read_into_a_buffer_of_the_wrong_size_is_refused(tmp_path):
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        await c.put("/b/x", b"0123456789")
        plan = await c.plan("/b/x")
        with pytest.raises(blobsdk.BadRequest, match=r"^/b/x: a buffer of 9 bytes for a blob of 10$"):
            await c._open.readpath.read_into(plan, memoryview(bytearray(9)))


@pytest.mark.parametrize("l1", [NO_L1, L1Config()])
async def test_a_read_that_copies_a_chunk_out_gives_its_buffer_back_and_one_that_fills_l1_does_not(tmp_path, l1):
    """A get or a one-off read (``fill_memory=False``) gives each chunk buffer it alone
    copied out of back, and later fetches read into them (bytes still exact); a get that
    filled L1 gave none back (L1 keeps them).  (From a lone replica whole chunks would go
    straight into the output: two replicas here.)"""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        ReplicatedBlockStore([LocalBlockStore(tmp_path / "r0"), LocalBlockStore(tmp_path / "r1")]) as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL, l1=l1) as c,
    ):
        data = data_of(600_000, 12)  # 10 chunks
        await c.put("/b/x", data)
        pool = c._open.readpath.buffers
        for _ in range(2):
            assert await c.get("/b/x", offset=1) == data[1:]
        assert (pool.reused > 0) is (l1 is NO_L1)
        reused = pool.reused
        plan = await c.plan("/b/x")
        cuts = [0, *(plan.chunk_size * i + 7 for i in range(1, len(plan.chunks))), len(data)]
        for _ in range(3):
            out = bytearray(len(data))
            windows = [memoryview(out)[a:b] for a, b in itertools.pairwise(cuts)]
            await c._open.readpath.read_into(plan, windows, fill_memory=False)
            assert out == data
        assert (pool.reused > reused) is (l1 is NO_L1)  # with L1, the gets filled it: nothing was fetched


class NoBuffers(BufferPool):
    """A buffer pool that refuses to hand out a buffer: the read must not need one."""

    def take(self, size: int) -> memoryview:
        raise AssertionError("a chunk buffer was taken")


async def test_a_one_off_read_of_whole_chunks_goes_straight_into_the_output(tmp_path):
    """From a lone L4 replica, a one-off read's whole uncompressed chunks are read into the
    caller's memory and verified there: no chunk buffer, no copy; a chunk L1 holds still
    comes from L1, and a bad copy is CorruptData as ever."""
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        data = data_of(600_000, 13)
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        path = c._open.readpath
        l4 = path.tiers[-1]
        real, l4.buffers = l4.buffers, NoBuffers()
        out = bytearray(len(data))
        await path.read_into(plan, memoryview(out), fill_memory=False)
        assert out == data and l4.stats.hits == len(plan.chunks)
        l4.buffers = real
        block = next(p for p in (tmp_path / "blocks").rglob("*") if p.is_file() and p.name == plan.chunks[0].block_id)
        raw = bytearray(block.read_bytes())
        raw[plan.chunks[3].offset] ^= 0xFF
        block.chmod(0o644)
        block.write_bytes(raw)
        with pytest.raises(blobsdk.CorruptData):
            await path.read_into(plan, memoryview(bytearray(len(data))), fill_memory=False)


class Gated(OneAtATime):
    """A block store whose reads wait for the test to release them, and once started cannot be
    stopped, as a read on a thread: cancelled, one ends only once it has written into ``out``
    (BlockReplica's contract)."""

    def __init__(self, root) -> None:
        super().__init__(LocalBlockStore(root))
        self.started, self.release = asyncio.Event(), asyncio.Event()
        self.finished = 0

    async def read_into(self, block_id, offset, out, *, call=None):
        self.started.set()
        job = asyncio.ensure_future(self._read_when_released(block_id, offset, out, call))
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            await asyncio.wait([job])
            raise

    async def _read_when_released(self, block_id, offset, out, call):
        await self.release.wait()
        await super().read_into(block_id, offset, out, call=call)
        self.finished += 1


async def test_a_cancelled_direct_read_ends_before_the_cancellation_goes_on(tmp_path):
    """Nothing writes into the caller's memory once its read is over, cancelled included:
    the cancelled read waits for the replica's read it started."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        Gated(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c,
    ):
        data = data_of(64 << 10, 14)
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        out = bytearray(len(data))
        read = asyncio.create_task(c._open.readpath.read_into(plan, memoryview(out), fill_memory=False))
        await blocks.started.wait()
        read.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not read.done()  # waiting for the replica's read into out
        blocks.release.set()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert blocks.finished == 1 and out == data
