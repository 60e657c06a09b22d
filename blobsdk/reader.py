"""The read path over L4: fetch only the chunks that cover a byte range, concurrently, verify
each one against its checksum (failing over between replicas), decode, and assemble.

Copies: an uncompressed chunk wholly inside the range is read straight into its place in
the output buffer and verified there (zero extra copies).  A compressed chunk, or one only
partly inside the range, is read into a scratch buffer, verified, and its slice copied.

Range rule: ``offset`` past the end gives an empty result; ``offset + length`` past the end
gives the bytes up to the end; a negative ``offset`` or ``length`` is a ValueError.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from concurrent.futures import Executor

import lz4.block
import xxhash

from ._tasks import task_group
from .errors import BlobError, BlockNotFound, CorruptData, Unavailable
from .sources.base import BlockStore
from .stats import TierStats
from .wire import ChunkRef, ReadPlan

_INLINE_DECODE = 256 << 10  # smaller payloads are decompressed on the loop thread


def resolve_range(size: int, offset: int, length: int | None) -> tuple[int, int]:
    """Clamp a requested range to ``[start, end)`` inside a blob of ``size`` bytes."""
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    if length is not None and (not isinstance(length, int) or length < 0):
        raise ValueError(f"length must be None or an int >= 0, got {length!r}")
    start = min(offset, size)
    end = size if length is None else min(size, offset + length)
    return start, max(start, end)


class Reader:
    """Reads plans from a BlockStore; one instance per client."""

    def __init__(self, blocks: BlockStore, executor: Executor, parallel_chunks: int, stats: TierStats) -> None:
        self._blocks = blocks
        self._executor = executor
        self._parallel = parallel_chunks
        self._stats = stats

    async def read(self, plan: ReadPlan, offset: int = 0, length: int | None = None) -> bytearray:
        start, end = resolve_range(plan.size, offset, length)
        out = bytearray(end - start)
        jobs = list(_overlapping(plan.chunks, start, end))
        if len(jobs) == 1:
            await self._read_chunk(memoryview(out), start, *jobs[0])
            return out
        slots = asyncio.Semaphore(self._parallel)
        async with task_group() as tasks:
            for job in jobs:
                tasks.create_task(self._bounded(slots, memoryview(out), start, *job))
        return out

    async def _bounded(self, slots: asyncio.Semaphore, out: memoryview, start: int, ref: ChunkRef, chunk_start: int) -> None:
        async with slots:
            await self._read_chunk(out, start, ref, chunk_start)

    async def _read_chunk(self, out: memoryview, start: int, ref: ChunkRef, chunk_start: int) -> None:
        """Place the part of chunk ``ref`` (which begins at blob offset ``chunk_start``)
        that falls inside the output window beginning at blob offset ``start``."""
        lo = max(chunk_start, start)
        hi = min(chunk_start + ref.raw_length, start + len(out))
        target = out[lo - start : hi - start]
        if ref.codec == "none" and hi - lo == ref.raw_length:
            await self.fetch_verified(ref, target)
            return
        raw = await self.fetch_raw(ref)
        target[:] = raw[lo - chunk_start : hi - chunk_start]

    async def fetch_raw(self, ref: ChunkRef) -> memoryview:
        """The verified, decoded raw bytes of one chunk."""
        buf = memoryview(bytearray(ref.length))
        return await self.fetch_verified(ref, buf)

    async def fetch_verified(self, ref: ChunkRef, buf: memoryview) -> memoryview:
        """Read the stored bytes of ``ref`` into ``buf`` from the first replica whose copy
        decodes to the checksum; returns the raw bytes (``buf`` itself when uncompressed)."""
        failures: list[BlobError] = []
        for replica in self._blocks.replicas:
            begun = time.perf_counter()
            try:
                await replica.read_into(ref.block_id, ref.offset, buf)
                raw = await self._decode(ref, buf)
            except (BlockNotFound, Unavailable, CorruptData) as exc:
                self._note_failure(exc)
                failures.append(exc)
                continue
            self._stats.hit(ref.raw_length, time.perf_counter() - begun)
            return raw
        raise _give_up(ref, failures)

    async def _decode(self, ref: ChunkRef, stored: memoryview) -> memoryview:
        raw = stored
        if ref.codec == "lz4":
            raw = await self._decompress(ref, stored)
        if len(raw) != ref.raw_length or xxhash.xxh3_64_intdigest(raw) != ref.checksum:
            raise _BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: checksum mismatch")
        return raw

    async def _decompress(self, ref: ChunkRef, stored: memoryview) -> memoryview:
        try:
            if len(stored) < _INLINE_DECODE:
                return memoryview(_lz4_decode(stored, ref.raw_length))
            loop = asyncio.get_running_loop()
            return memoryview(await loop.run_in_executor(self._executor, _lz4_decode, stored, ref.raw_length))
        except lz4.block.LZ4BlockError as exc:
            raise _BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: undecodable lz4: {exc}") from exc

    def _note_failure(self, exc: BlobError) -> None:
        if isinstance(exc, _BadCopy):
            self._stats.corrupt += 1
        else:
            self._stats.errors += 1


class _BadCopy(CorruptData):
    """One replica's copy failed verification (the reader then tries the next)."""


def _lz4_decode(stored: memoryview, raw_length: int) -> bytes:
    return lz4.block.decompress(stored, uncompressed_size=raw_length)


def _give_up(ref: ChunkRef, failures: list[BlobError]) -> BlobError:
    if any(isinstance(f, CorruptData) for f in failures):
        return CorruptData(f"chunk {ref.key}: no replica returned bytes matching its checksum ({failures[-1]})")
    if failures and all(isinstance(f, BlockNotFound) for f in failures):
        return BlockNotFound(f"block {ref.block_id} is gone from every replica (blob deleted or replaced?)")
    return Unavailable(f"chunk {ref.key}: every replica failed; last error: {failures[-1] if failures else 'no replicas'}")


def _overlapping(chunks: tuple[ChunkRef, ...], start: int, end: int) -> list[tuple[ChunkRef, int]]:
    """(chunk, blob offset where it begins) for every chunk overlapping ``[start, end)``."""
    if start >= end:
        return []
    starts = list(itertools.accumulate((c.raw_length for c in chunks), initial=0))
    first = bisect.bisect_right(starts, start) - 1
    last = bisect.bisect_left(starts, end)
    return [(chunks[i], starts[i]) for i in range(first, min(last, len(chunks)))]
