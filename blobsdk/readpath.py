"""The tiered read path (DESIGN §2): for each chunk a plan needs, walk the tiers in order —
L1 memory, L2 local disk, (peers), L3 regional flash, L4 durable — with one fetch per chunk
key in flight (single-flight), verify bytes at every tier boundary, and fill the upper tiers
on the way back.

Range rule: ``offset`` past the end gives an empty result; ``offset + length`` past the end
gives the bytes up to the end; a negative ``offset`` or ``length`` is a ValueError.

Copies: a chunk is fetched whole (its checksum covers all of it) into a buffer that the
upper tiers keep as is, and the requested slice is copied once into the output.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Sequence
from concurrent.futures import Executor

import lz4.block
import xxhash

from ._tasks import task_group
from .errors import Unavailable
from .tiers.base import BadCopy, Tier
from .tiers.l1 import L1Tier
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


def verify_raw(ref: ChunkRef, raw: memoryview) -> memoryview:
    """``raw`` if it is the chunk's exact raw bytes, else BadCopy."""
    if len(raw) != ref.raw_length or xxhash.xxh3_64_intdigest(raw) != ref.checksum:
        raise BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: checksum mismatch")
    return raw


def decode_chunk(ref: ChunkRef, stored: memoryview) -> memoryview:
    """Decode a chunk's stored bytes and verify them: the raw bytes, or BadCopy."""
    if ref.codec == "none":
        return verify_raw(ref, stored)
    try:
        raw = lz4.block.decompress(stored, uncompressed_size=ref.raw_length)
    except lz4.block.LZ4BlockError as exc:
        raise BadCopy(f"chunk {ref.key} at block {ref.block_id}+{ref.offset}: undecodable lz4: {exc}") from exc
    return verify_raw(ref, memoryview(raw))


class ReadPath:
    """Reads plans through an ordered list of tiers; the last one must never miss (L4)."""

    def __init__(self, tiers: Sequence[Tier], executor: Executor, parallel_chunks: int) -> None:
        if not tiers:
            raise ValueError("a read path needs at least one tier")
        self.tiers = tuple(tiers)
        self._executor = executor
        self._parallel = parallel_chunks
        self._inflight: dict[str, _Fetch] = {}
        self._l1 = next((t for t in self.tiers if isinstance(t, L1Tier)), None)
        self._below_l1 = tuple(t for t in self.tiers if t is not self._l1)  # L1 is peeked, not walked

    async def read(self, plan: ReadPlan, offset: int = 0, length: int | None = None) -> bytearray:
        start, end = resolve_range(plan.size, offset, length)
        jobs = _overlapping(plan.chunks, start, end)
        if len(jobs) == 1 and jobs[0][1] == start and jobs[0][0].raw_length == end - start:
            return await self._whole_chunk(jobs[0][0])
        out = bytearray(end - start)
        if len(jobs) == 1:
            await self._place(memoryview(out), start, *jobs[0])
            return out
        slots = asyncio.Semaphore(self._parallel)
        async with task_group() as tasks:
            for ref, chunk_start in jobs:
                tasks.create_task(self._bounded(slots, memoryview(out), start, ref, chunk_start))
        return out

    async def chunk(self, ref: ChunkRef) -> memoryview:
        """The verified raw bytes of one chunk, from the highest tier that has them."""
        raw, _ = await self._chunk(ref)
        return raw

    async def _whole_chunk(self, ref: ChunkRef) -> bytearray:
        """A read of exactly one whole chunk: its buffer itself when nobody else holds it
        (no upper tier kept it, no other reader shares the fetch), else a copy."""
        raw, sole = await self._chunk(ref)
        if sole and isinstance(raw.obj, bytearray) and raw.nbytes == len(raw.obj):
            return raw.obj
        return bytearray(raw)

    async def _chunk(self, ref: ChunkRef) -> tuple[memoryview, bool]:
        """The chunk's raw bytes, and whether the caller is their only holder."""
        if self._l1 is not None:
            hit = self._l1.peek(ref)
            if hit is not None:
                return hit, False
        fetch = self._inflight.get(ref.key)
        if fetch is None:
            fetch = _Fetch(asyncio.get_running_loop().create_task(self._walk(ref), name=ref.key))
            self._inflight[ref.key] = fetch
            fetch.task.add_done_callback(self._landed)
        else:
            fetch.readers += 1
        fetch.waiting += 1
        try:
            raw, kept = await asyncio.shield(fetch.task)
        except asyncio.CancelledError:
            fetch.waiting -= 1
            if fetch.waiting == 0:  # the last reader left: nobody needs the fetch any more
                fetch.task.cancel()
                self._forget(fetch)  # a reader arriving now starts afresh, not on a dying fetch
            raise
        # No reader can join once the task is done: _landed, registered first, unlists it.
        return raw, not kept and fetch.readers == 1

    def _forget(self, fetch: _Fetch) -> None:
        if self._inflight.get(fetch.task.get_name()) is fetch:
            del self._inflight[fetch.task.get_name()]

    def _landed(self, task: asyncio.Task[tuple[memoryview, bool]]) -> None:
        fetch = self._inflight.get(task.get_name())
        if fetch is not None and fetch.task is task:
            self._forget(fetch)
        if not task.cancelled():
            task.exception()  # seen here, so a fetch whose readers all left never warns

    async def decode(self, ref: ChunkRef, stored: memoryview) -> memoryview:
        """The Decoder handed to tiers: large lz4 payloads decode on the executor (hashing
        alone is cheaper than the hop to a thread)."""
        if ref.codec == "none" or len(stored) < _INLINE_DECODE:
            return decode_chunk(ref, stored)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, decode_chunk, ref, stored)

    async def aclose(self) -> None:
        """Cancel fetches still in flight (their readers are gone), then close the tiers."""
        tasks = [fetch.task for fetch in self._inflight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for tier in self.tiers:
            await tier.aclose()

    async def _bounded(self, slots: asyncio.Semaphore, out: memoryview, start: int, ref: ChunkRef, chunk_start: int) -> None:
        async with slots:
            await self._place(out, start, ref, chunk_start)

    async def _place(self, out: memoryview, start: int, ref: ChunkRef, chunk_start: int) -> None:
        """Copy the part of chunk ``ref`` (which begins at blob offset ``chunk_start``) that
        falls inside the output window beginning at blob offset ``start``."""
        raw = await self.chunk(ref)
        lo = max(chunk_start, start)
        hi = min(chunk_start + ref.raw_length, start + len(out))
        out[lo - start : hi - start] = raw[lo - chunk_start : hi - chunk_start]

    async def _walk(self, ref: ChunkRef) -> tuple[memoryview, bool]:
        """The raw bytes from the first tier that has them, and whether an upper tier kept
        a reference to them while filling."""
        for depth, tier in enumerate(self._below_l1):
            raw = await tier.fetch(ref, self.decode)
            if raw is not None:
                uppers = [*self._below_l1[:depth], *([self._l1] if self._l1 else [])]
                for upper in uppers:
                    await upper.fill(ref, raw)
                return raw, bool(uppers)
        raise Unavailable(f"chunk {ref.key}: no tier could serve it")  # L4 raises before this


class _Fetch:
    """One chunk fetch in flight: how many readers joined it, and how many still wait."""

    __slots__ = ("task", "readers", "waiting")

    def __init__(self, task: asyncio.Task[tuple[memoryview, bool]]) -> None:
        self.task = task
        self.readers = 1
        self.waiting = 0


def _overlapping(chunks: Sequence[ChunkRef], start: int, end: int) -> list[tuple[ChunkRef, int]]:
    """(chunk, blob offset where it begins) for every chunk overlapping ``[start, end)``."""
    if start >= end:
        return []
    if len(chunks) == 1:
        return [(chunks[0], 0)]
    starts = list(itertools.accumulate((c.raw_length for c in chunks), initial=0))
    first = bisect.bisect_right(starts, start) - 1
    last = bisect.bisect_left(starts, end)
    return [(chunks[i], starts[i]) for i in range(first, min(last, len(chunks)))]
