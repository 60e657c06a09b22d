"""A one-off read's groups (ReadPath._start_groups): whole uncompressed chunks of one block
read straight into the caller's memory in one request per group, each verified on its own."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from pathlib import Path

import pytest

import blobsdk
from blobsdk.config import L1Config, WriteConfig
from blobsdk.metadata import SqliteMetadataStore
from blobsdk.read import readpath
from blobsdk.runtime.buffers import BufferPool
from blobsdk.sources import LocalBlockStore, ReplicatedBlockStore, _localread
from blobsdk.wire import ChunkRef, ReadPlan
from tests.block_fixtures import GatedSpans, OneAtATime, pack_chunks

SMALL = WriteConfig(chunk_size=64 << 10, block_size=256 << 10)


class Spans(LocalBlockStore):
    """A local store that records each group it is asked for: (block, the spans' offsets)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.groups: list[tuple[str, list[int]]] = []

    async def read_spans(self, block_id, spans, *, check=None, call=None):
        self.groups.append((block_id, [s.offset for s in spans]))
        return await super().read_spans(block_id, spans, check=check, call=call)


def plan_of(refs: list[ChunkRef]) -> ReadPlan:
    return ReadPlan(path="/t/x", version=1, etag="e", size=sum(r.raw_length for r in refs), chunk_size=1, chunks=tuple(refs))


def windows(out: bytearray, cuts: list[int]) -> list[memoryview]:
    return [memoryview(out)[a:b] for a, b in itertools.pairwise([0, *cuts, len(out)])]


class NoBuffers(BufferPool):
    def take(self, size: int) -> memoryview:
        raise AssertionError("a chunk buffer was taken")


async def test_groups_read_mixed_plans_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of two blocks interleaved, out of order, repeated, one compressed, the outputs
    cut anywhere (a chunk over three windows, empty windows): every uncompressed chunk goes
    to a group of its block, in the order of offsets, at most GROUP_CHUNKS of them; the
    compressed one is fetched as ever; the bytes are exact."""
    monkeypatch.setattr(readpath, "GROUP_CHUNKS", 3)
    rng = random.Random(5)
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        Spans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, l1=L1Config(capacity_bytes=0)) as c,
    ):
        a_raws = [rng.randbytes(n) for n in (3000, 10, 7000, 1, 4096, 2500)]
        b_raws = [rng.randbytes(n) for n in (5000, 600, 900)]
        a, b = await pack_chunks(blocks, a_raws), await pack_chunks(blocks, b_raws)
        (z,) = await pack_chunks(blocks, [b"zz" * 3000], "lz4")
        order = [a[0], b[0], a[1], a[3], z, b[2], a[2], b[1], a[0], a[5], a[4]]
        raw_of = {r.key: raw for r, raw in zip([*a, *b, z], [*a_raws, *b_raws, b"zz" * 3000], strict=True)}
        expected = b"".join(raw_of[r.key] for r in order)
        out = bytearray(len(expected))
        cuts = [0, 1500, 1600, 2999, 3000, 3005, 12_000, 12_000, 20_000]
        await c._open.readpath.read_into(plan_of(order), windows(out, cuts), fill_memory=False)
        assert out == expected
        l4 = c._open.readpath.tiers[-1]
        assert l4.stats.hits == len(order) and l4.stats.corrupt == 0
        grouped = sorted(offset for _, offsets in blocks.groups for offset in offsets)
        assert grouped == sorted(r.offset for r in order if r.codec == "none")  # each uncompressed chunk once
        for block_id, offsets in blocks.groups:
            assert block_id in (a[0].block_id, b[0].block_id) and offsets == sorted(offsets) and len(offsets) <= 3


async def test_a_group_stops_at_group_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readpath, "GROUP_BYTES", 10_000)
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        Spans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks) as c,
    ):
        raws = [os.urandom(n) for n in (4000, 4000, 4000, 20_000, 100, 100)]
        refs = await pack_chunks(blocks, raws)
        out = bytearray(sum(map(len, raws)))
        await c._open.readpath.read_into(plan_of(refs), memoryview(out), fill_memory=False)
        assert out == b"".join(raws)
        sizes = [[r.length for r in refs if r.offset in offsets] for _, offsets in blocks.groups]
        assert sorted(sizes) == [[100, 100], [4000], [4000, 4000], [20_000]]


async def test_a_chunk_l1_holds_is_copied_from_l1_and_the_rest_grouped(tmp_path: Path) -> None:
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        Spans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c,
    ):
        data = os.urandom(5 * (64 << 10))
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        assert await c.get("/b/x", offset=(64 << 10) + 5, length=10) == data[(64 << 10) + 5 : (64 << 10) + 15]  # L1 holds chunk 1
        blocks.groups.clear()
        out = bytearray(len(data))
        await c._open.readpath.read_into(plan, memoryview(out), fill_memory=False)
        assert out == data
        assert sorted(o for _, offsets in blocks.groups for o in offsets) == sorted(
            r.offset for i, r in enumerate(plan.chunks) if i != 1
        )
        assert c.stats()["l1"]["hits"] == 1


async def test_a_bad_chunk_inside_a_group_fails_the_read_with_its_own_error(tmp_path: Path) -> None:
    async with blobsdk.Client.local(tmp_path, write=SMALL) as c:
        data = os.urandom(4 * (64 << 10))
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        bad = plan.chunks[2]
        assert len(plan.block_ids()) == 1
        (path,) = (tmp_path / "blocks").rglob(bad.block_id)
        raw = bytearray(path.read_bytes())
        raw[bad.offset + 100] ^= 0x01
        path.chmod(0o644)
        path.write_bytes(raw)
        with pytest.raises(blobsdk.CorruptData) as info:
            await c._open.readpath.read_into(plan, memoryview(bytearray(len(data))), fill_memory=False)
        assert str(info.value) == (
            f"chunk {bad.key}: no replica returned bytes matching its checksum "
            f"(chunk {bad.key} at block {bad.block_id}+{bad.offset}: checksum mismatch)"
        )
        l4 = c.stats()["l4"]
        assert (l4["hits"], l4["corrupt"], l4["misses"]) == (3, 1, 1)


async def test_a_read_cancelled_mid_group_ends_before_the_cancellation_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing writes into the caller's memory once its read is over, cancelled included:
    the cancelled read waits for the group's job, which reads nothing after the run it is in."""
    monkeypatch.setattr(_localread, "RUN_BYTES", 1)  # each chunk a run of its own
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        GatedSpans(tmp_path / "blocks") as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c,
    ):
        data = os.urandom(3 * (64 << 10))
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        out = bytearray(len(data))
        read = asyncio.create_task(c._open.readpath.read_into(plan, memoryview(out), fill_memory=False))
        await blocks.started.wait()
        read.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not read.done()  # waiting for the group's job
        blocks.release.set()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert blocks.checked == [0]
        first = plan.chunks[0].raw_length
        assert out[:first] == data[:first] and out[first:] == bytes(len(data) - first)


async def test_several_replicas_keep_the_one_chunk_at_a_time_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_spans(*args, **kwargs):
        raise AssertionError("read_spans was called")

    monkeypatch.setattr(LocalBlockStore, "read_spans", no_spans)
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        ReplicatedBlockStore([LocalBlockStore(tmp_path / "r0"), LocalBlockStore(tmp_path / "r1")]) as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c,
    ):
        data = os.urandom(300_000)
        await c.put("/b/x", data)
        out = bytearray(len(data))
        await c._open.readpath.read_into(await c.plan("/b/x"), memoryview(out), fill_memory=False)
        assert out == data


async def test_a_replica_that_reads_no_spans_still_reads_whole_chunks_straight_in(tmp_path: Path) -> None:
    """Its groups are refused: each whole chunk is read straight into its one window, one at
    a time (no chunk buffer); a chunk cut over two windows is fetched into a buffer."""
    async with (
        SqliteMetadataStore(tmp_path / "meta.sqlite") as meta,
        OneAtATime(LocalBlockStore(tmp_path / "blocks")) as blocks,
        blobsdk.Client.from_stores(meta, blocks, write=SMALL) as c,
    ):
        data = os.urandom(300_000)
        await c.put("/b/x", data)
        plan = await c.plan("/b/x")
        path = c._open.readpath
        l4 = path.tiers[-1]
        real, l4.buffers = l4.buffers, NoBuffers()
        out = bytearray(len(data))
        cut = plan.chunks[0].raw_length
        await path.read_into(plan, windows(out, [cut, 2 * cut]), fill_memory=False)
        assert out == data and l4.stats.hits == len(plan.chunks)
        with pytest.raises(AssertionError, match=r"^a chunk buffer was taken$"):
            await path.read_into(plan, windows(bytearray(len(data)), [cut + 1]), fill_memory=False)
        l4.buffers = real
        out = bytearray(len(data))
        await path.read_into(plan, windows(out, [cut + 1]), fill_memory=False)
        assert out == data
