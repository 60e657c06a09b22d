"""The BlockStore conformance suites: what every L4 backend holds (blobsdk/sources/base.py),
checked the same way for blobsdk's own backends and for one you write.

Subclass :class:`BlockReplicaTests` (a backend: one copy, read directly) or
:class:`BlockStoreTests` (a store of several replicas: written, listed, deleted, read through
its replicas) in a ``test_*.py`` module, in a class named ``Test...`` (so pytest collects it;
the suites' own names do not start with ``Test``, so neither is collected alone), and provide
a fixture named ``store`` that yields an empty, open store (and closes it afterwards), whose
writes are on every replica once acknowledged (async: ``pytest_asyncio.fixture`` in
pytest-asyncio's strict mode).  The suites need pytest and pytest-asyncio (the ``testing``
extra); their tests carry the asyncio mark.
"""

from __future__ import annotations

import asyncio
import os

from .._extras import requires_extra
from ..errors import BadRequest, BlobError, BlockNotFound, CorruptData
from ..sources import BlockReplica, BlockStore, block_time, new_block_id

with requires_extra("testing", "blobsdk.testing"):
    import pytest

MiB = 1 << 20
INVALID_IDS = ["", "../x", "ABC", "0" * 31, "0" * 33, "A" * 32, "../" + "0" * 29, "g" * 32, "0" * 30 + "/x"]


def payload(n: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating-looking bytes (so an offset mistake cannot pass)."""
    return bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


async def listed(store: BlockStore) -> list[tuple[str, int]]:
    return [(info.block_id, info.size) async for info in store.list_blocks()]


async def read_back(store: BlockStore, block_id: str, offset: int, length: int) -> bytes:
    """What every replica of ``store`` holds there (they must agree), or the error every one
    raises (a single backend is its own only replica: its own answer)."""
    answers: list[bytes | BlobError] = []
    for replica in store.replicas:
        try:
            answers.append(await replica.read_range(block_id, offset, length))
        except BlobError as exc:
            answers.append(exc)
    first = answers[0]
    if isinstance(first, BlobError):
        assert all(type(a) is type(first) for a in answers), answers
        raise first
    assert all(a == first for a in answers), "the replicas disagree"
    return first


class BlockStoreTests:
    """Every store passes these, a replicated one too.  Fixture ``store``: an empty, open
    BlockStore; what it wrote is read back from its replicas."""

    pytestmark = pytest.mark.asyncio

    async def test_is_a_block_store(self, store: BlockStore) -> None:
        assert isinstance(store, BlockStore)
        assert isinstance(store.name, str) and store.name
        assert store.replicas and all(isinstance(r, BlockReplica) for r in store.replicas)

    async def test_round_trip_of_several_parts(self, store: BlockStore) -> None:
        data = payload(10_000)
        block = new_block_id()
        await store.write_block(block, [data[:10], bytearray(data[10:5000]), memoryview(data)[5000:]])
        assert await read_back(store, block, 0, len(data)) == data

    @pytest.mark.parametrize("bad_id", INVALID_IDS)
    async def test_invalid_ids_are_refused_before_any_io(self, store: BlockStore, bad_id: str) -> None:
        with pytest.raises(BadRequest):
            await store.write_block(bad_id, [b"data"])
        with pytest.raises(BadRequest):
            await read_back(store, bad_id, 0, 1)
        for replica in store.replicas:
            with pytest.raises(BadRequest):
                await replica.read_into(bad_id, 0, memoryview(bytearray(1)))
        with pytest.raises(BadRequest):
            await store.delete_block(bad_id)
        assert await listed(store) == []

    async def test_rewrite_with_same_bytes_is_a_no_op(self, store: BlockStore) -> None:
        block = new_block_id()
        data = payload(3000, seed=3)
        await store.write_block(block, [data])
        await store.write_block(block, [data[:1000], data[1000:]])
        assert await read_back(store, block, 0, 3000) == data
        assert await listed(store) == [(block, 3000)]

    async def test_write_copies_nothing_the_caller_may_reuse(self, store: BlockStore) -> None:
        block = new_block_id()
        buf = bytearray(b"original")
        await store.write_block(block, [buf])
        buf[:] = b"mutated!"
        assert await read_back(store, block, 0, 8) == b"original"

    async def test_delete_is_idempotent(self, store: BlockStore) -> None:
        block = new_block_id()
        await store.write_block(block, [b"x" * 10])
        await store.delete_block(block)
        await store.delete_block(block)
        await store.delete_block(new_block_id())
        with pytest.raises(BlockNotFound):
            await read_back(store, block, 0, 1)
        assert await listed(store) == []

    async def test_list_is_sorted_with_sizes_and_times(self, store: BlockStore) -> None:
        # Ids in random order; written blocks' ids begin with "0" (their time's first digit
        # until 2527: sources/base.py), never with LINK_TAG, which S3 keeps for link blocks.
        blocks = {"0" + os.urandom(16).hex()[1:]: n for n in (1, 17, 300, 4096, 5)}
        for block, size in blocks.items():
            await store.write_block(block, [payload(size)])
        infos = [info async for info in store.list_blocks()]
        assert [(i.block_id, i.size) for i in infos] == sorted(blocks.items())
        assert all(i.created == block_time(i.block_id) for i in infos)

    async def test_list_skips_deleted_blocks(self, store: BlockStore) -> None:
        keep, drop = new_block_id(), new_block_id()
        await store.write_block(keep, [b"k"])
        await store.write_block(drop, [b"dd"])
        await store.delete_block(drop)
        assert await listed(store) == [(keep, 1)]

    async def test_empty_store_lists_nothing(self, store: BlockStore) -> None:
        assert await listed(store) == []

    async def test_empty_block(self, store: BlockStore) -> None:
        block = new_block_id()
        await store.write_block(block, [])
        assert await listed(store) == [(block, 0)]
        with pytest.raises(CorruptData):
            await read_back(store, block, 0, 1)

    async def test_many_small_parts(self, store: BlockStore) -> None:
        parts = [payload(3, seed=i) for i in range(3000)]  # more than IOV_MAX buffers
        block = new_block_id()
        await store.write_block(block, parts)
        assert await read_back(store, block, 0, 9000) == b"".join(parts)

    async def test_large_block_round_trip(self, store: BlockStore) -> None:
        data = os.urandom(20 * MiB)
        block = new_block_id()
        await store.write_block(block, [memoryview(data)[i : i + 4 * MiB] for i in range(0, len(data), 4 * MiB)])
        for replica in store.replicas:
            out = bytearray(len(data))
            await replica.read_into(block, 0, memoryview(out))
            assert out == data
        assert await read_back(store, block, 17 * MiB + 3, 2 * MiB) == data[17 * MiB + 3 : 19 * MiB + 3]

    async def test_concurrent_writes(self, store: BlockStore) -> None:
        blocks = {new_block_id(): payload(1000 + i, seed=i) for i in range(20)}
        await asyncio.gather(*(store.write_block(b, [d]) for b, d in blocks.items()))
        reads = await asyncio.gather(*(read_back(store, b, 0, len(d)) for b, d in blocks.items()))
        assert reads == list(blocks.values())
        assert await listed(store) == sorted((b, len(d)) for b, d in blocks.items())


class BlockReplicaTests(BlockStoreTests):
    """Every backend (one copy, read directly) passes these too.  Fixture ``store``: an
    empty, open BlockReplica."""

    async def test_is_a_block_replica(self, store: BlockReplica) -> None:
        assert isinstance(store, BlockReplica) and tuple(store.replicas) == (store,)

    async def test_read_into_fills_exactly_the_view(self, store: BlockReplica) -> None:
        data = payload(4096, seed=1)
        block = new_block_id()
        await store.write_block(block, [data])
        for offset, length in [(0, 100), (1, 7), (4000, 96), (2048, 1)]:
            buf = bytearray(b"\xee" * 300)
            await store.read_into(block, offset, memoryview(buf)[100 : 100 + length])
            assert buf[100 : 100 + length] == data[offset : offset + length]
            assert buf[:100] == b"\xee" * 100 and buf[100 + length :] == b"\xee" * (200 - length)

    async def test_read_range_at_offsets(self, store: BlockReplica) -> None:
        data = payload(5000, seed=2)
        block = new_block_id()
        await store.write_block(block, [data])
        for offset, length in [(0, 1), (4999, 1), (123, 4000), (0, 5000)]:
            assert await store.read_range(block, offset, length) == data[offset : offset + length]

    async def test_zero_length_read(self, store: BlockReplica) -> None:
        block = new_block_id()
        await store.write_block(block, [b"abc"])
        assert await store.read_range(block, 1, 0) == b""

    @pytest.mark.parametrize(("offset", "length"), [(0, 11), (5, 6), (10, 1), (11, 1), (1000, 10)])
    async def test_read_past_the_end_is_corrupt_data(self, store: BlockReplica, offset: int, length: int) -> None:
        block = new_block_id()
        await store.write_block(block, [b"0123456789"])
        with pytest.raises(CorruptData):
            await store.read_range(block, offset, length)
        with pytest.raises(CorruptData):
            await store.read_into(block, offset, memoryview(bytearray(length)))

    async def test_missing_block_is_block_not_found(self, store: BlockReplica) -> None:
        with pytest.raises(BlockNotFound):
            await store.read_range(new_block_id(), 0, 1)
        with pytest.raises(BlockNotFound):
            await store.read_into(new_block_id(), 0, memoryview(bytearray(10)))

    async def test_negative_offset_or_length_is_value_error(self, store: BlockReplica) -> None:
        block = new_block_id()
        await store.write_block(block, [b"abc"])
        with pytest.raises(ValueError):
            await store.read_range(block, -1, 1)
        with pytest.raises(ValueError):
            await store.read_range(block, 0, -1)
        with pytest.raises(ValueError):
            await store.read_into(block, -1, memoryview(bytearray(1)))
