"""The scale benchmark's curves of L4's background work (benchmarks/scale.py): gc, scrub and
repair over a SQLite metadata store of 10^4 ... 10^N one-chunk plans, each in its own block,
grown a decade at a time, with an in-memory block store (:class:`_MemoryBlocks`: the curves
are of the passes' own work, not of a disk), 10% more blocks than plans (garbage for gc).

- ``repair_batch_ms``: the live chunks of a batch of 64 reported blocks
  (:func:`blobsdk.ops.repair.live_chunks`, through the store's block -> plans index), the
  median of 5; ``repair_walk_batch_ms`` the same found as repair did before that index, by
  walking every live plan (``_walk``): O(plans) per batch.
- ``gc_us_per_block``: a gc pass (:func:`blobsdk.ops.collect_garbage`: listing, two walks of the
  plans, fences, deletes) per block listed; ``gc_peak_bytes_per_block``: the most memory a
  dry-run pass held (tracemalloc's peak), per block.  gc is mark and sweep: a pass is O(blocks
  + plans), and flat per block is the goal.
Times are CPU seconds of this process (:func:`_timed`).

- ``scrub_us_per_block``: a dry-run scrub (:func:`blobsdk.ops.scrub`: every live
  block read from its one replica and verified) per block.
"""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path

import xxhash

from blobsdk.metadata import SqliteMetadataStore
from blobsdk.metadata.base import MetadataStore
from blobsdk.ops import collect_garbage, scrub
from blobsdk.ops.repair import live_chunks
from blobsdk.wire import BlockInfo, ChunkRef, CommitOp, ReadPlan, etag_of

from ._report import median
from ._scale_curves import Curve

MINTED_MS = 1_700_000_000_000  # every block's id says it was minted then: older than any grace
GARBAGE = 0.1  # blocks no plan names, per plan
BATCH = 64  # blocks per repair batch (RepairConfig.batch's default)
PAYLOAD = 64  # bytes per block


def block_id(n: int) -> str:
    return f"{MINTED_MS:012x}{n:020x}"


def payload(n: int) -> bytes:
    return n.to_bytes(8, "big") * (PAYLOAD // 8)


def _plan(n: int) -> ReadPlan:
    data = payload(n)
    ref = ChunkRef(
        block_id=block_id(n), offset=0, length=len(data), raw_length=len(data), checksum=xxhash.xxh3_64_intdigest(data)
    )
    return ReadPlan(
        path=f"/lake/ops/{n:010d}",
        version=0,
        etag=etag_of((ref,), len(data)),
        size=len(data),
        chunk_size=len(data),
        chunks=(ref,),
    )


class _MemoryBlocks:
    """A BlockStore and its one replica, in a dict: what gc, scrub and repair call."""

    name = "memory"

    def __init__(self) -> None:
        self.blocks: dict[str, bytes] = {}

    @property
    def replicas(self) -> tuple[_MemoryBlocks]:
        return (self,)

    async def write_block(self, block_id: str, parts: Sequence[bytes]) -> None:
        self.blocks[block_id] = b"".join(parts)

    async def delete_block(self, block_id: str) -> None:
        self.blocks.pop(block_id, None)

    async def list_blocks(self) -> AsyncIterator[BlockInfo]:
        for block_id, data in list(self.blocks.items()):
            yield BlockInfo(block_id=block_id, size=len(data), created=MINTED_MS / 1000)

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        return self.blocks[block_id][offset : offset + length]

    async def aclose(self) -> None:
        return None


async def _walk(metadata: MetadataStore, only: set[str]) -> dict[str, list[ChunkRef]]:
    """The live chunks of ``only`` as repair found them before the reverse index."""
    index: dict[str, dict[str, ChunkRef]] = {}
    async for plan in metadata.iter_plans():
        for ref in plan.chunks:
            if ref.block_id in only:
                index.setdefault(ref.block_id, {})[ref.key] = ref
    return {b: sorted(refs.values(), key=lambda r: r.offset) for b, refs in sorted(index.items())}


async def _grow(metadata: MetadataStore, blocks: _MemoryBlocks, start: int, stop: int) -> None:
    for low in range(start, stop, 500):
        plans = [_plan(n) for n in range(low, min(stop, low + 500))]
        await metadata.commit_many([CommitOp(path=p.path, plan=p) for p in plans])
        for n in range(low, min(stop, low + 500)):
            blocks.blocks[block_id(n)] = payload(n)
    for g in range(int(start * GARBAGE), int(stop * GARBAGE)):
        blocks.blocks[block_id(10**12 + g)] = payload(g)


async def _timed(work: Awaitable[object]) -> float:
    """The CPU seconds (every thread's: scrub verifies off the loop) ``work`` took; the
    passes do no I/O here, and wall time on a shared machine would measure the other jobs."""
    began = time.process_time()
    await work
    return time.process_time() - began


async def ops_curves(exponents: range, tmp: Path) -> list[Curve]:
    repair = Curve("repair", "batch_ms", "ms per batch of 64 blocks")
    walk = Curve("repair_walk", "batch_ms", "ms per batch of 64 blocks")
    gc_time = Curve("gc", "us_per_block", "µs per block")
    gc_memory = Curve("gc", "peak_bytes_per_block", "bytes per entry")
    scrubs = Curve("scrub", "us_per_block", "µs per block")
    rng = random.Random(27)
    blocks, size = _MemoryBlocks(), 0
    async with SqliteMetadataStore(tmp / "ops.sqlite") as metadata:
        for e in exponents:
            await _grow(metadata, blocks, size, 10**e)
            size = 10**e
            batches = [{block_id(rng.randrange(size)) for _ in range(BATCH)} for _ in range(5)]
            repair.points[size] = median([await _timed(live_chunks(metadata, b)) for b in batches]) * 1e3
            walk.points[size] = await _timed(_walk(metadata, batches[0])) * 1e3
            listed = len(blocks.blocks)
            tracemalloc.start()
            await collect_garbage(metadata, blocks, 3600.0, 600.0, dry_run=True)
            gc_memory.points[size] = tracemalloc.get_traced_memory()[1] / listed
            tracemalloc.stop()
            gc_time.points[size] = await _timed(collect_garbage(metadata, blocks, 3600.0, 600.0)) / listed * 1e6
            scrubs.points[size] = await _timed(scrub(metadata, blocks, dry_run=True, concurrency=4)) / size * 1e6
    return [repair, walk, gc_time, gc_memory, scrubs]
