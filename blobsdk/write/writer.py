"""The write path: chunk, checksum, maybe compress, pack into blocks, write durably, commit.

A blob is cut into ``chunk_size`` chunks.  Each chunk gets an xxh3-64 checksum of its raw
bytes and is lz4-compressed only when that saves at least 10% (``compression="auto"``).
Chunks are packed back to back into blocks of about ``block_size``; many small blobs share
one block (:meth:`Writer.put_many`).  Blocks are written to L4 with bounded parallelism and
only once every block a blob touches is durable is its plan committed: the commit is the
atomic point (DESIGN invariant 4).

A commit is refused when the oldest block it names was minted more than
``max_write_seconds`` ago, so garbage collection with a longer grace period does not take a
block that a slow write is still about to commit.  Clocks may disagree: what makes gc safe is
its fence (gc.py), which the metadata store checks in every commit (BlockCollected).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import lz4.block
import xxhash

from .._arguments import check_bytes_like, check_pair
from ..chunks import validate_writable
from ..config import Compression, WriteConfig, check_write_config
from ..errors import BlockCollected, Unavailable
from ..metadata import PlanWriter
from ..runtime import task_group
from ..sources import BlockStore, Buffer, block_time, new_block_id
from ..wire import MAX_CHUNK_BYTES, ChunkRef, CommitOp, ReadPlan, etag_of

_SAMPLE = 64 << 10  # bytes compressed first to decide whether a chunk is worth compressing
_MIN_SAVING = 0.10
_INLINE_BYTES = 256 << 10  # chunks smaller than this are encoded on the loop thread
MAX_BATCH = 1000  # plans per commit_many (the API server's limit per request)

Progress = Callable[[int, int], None]
Item = tuple[str, Buffer]


@dataclass(frozen=True, slots=True)
class Encoded:
    """One chunk ready to be packed: the stored payload and how to check it."""

    payload: Buffer
    raw_length: int
    checksum: int
    codec: str


def encode_chunk(raw: memoryview, compression: Compression) -> Encoded:
    """Checksum ``raw`` and compress it when the policy says it pays."""
    checksum = xxhash.xxh3_64_intdigest(raw)
    if compression == "none" or not raw or (compression == "auto" and not _sample_compresses(raw)):
        return Encoded(raw, len(raw), checksum, "none")
    packed = lz4.block.compress(raw, store_size=False)
    if compression == "auto" and len(packed) > len(raw) * (1 - _MIN_SAVING):
        return Encoded(raw, len(raw), checksum, "none")
    return Encoded(packed, len(raw), checksum, "lz4")


def _sample_compresses(raw: memoryview) -> bool:
    if len(raw) <= _SAMPLE:
        return True  # small enough to just try the whole chunk
    sample = raw[:_SAMPLE]
    return len(lz4.block.compress(sample, store_size=False)) <= _SAMPLE * (1 - _MIN_SAVING)


def plan_of(path: str, refs: Sequence[ChunkRef], chunk_size: int | None = None) -> ReadPlan:
    """An uncommitted plan naming ``refs`` in order, as stored (no grants: refs reused from a
    plan read with grants carry them); ``chunk_size`` defaults to the largest ref's."""
    stored = tuple(ref.unsigned() for ref in refs)
    size = sum(ref.raw_length for ref in stored)
    size_of_chunks = chunk_size if chunk_size is not None else max((r.raw_length for r in stored), default=1)
    return ReadPlan(path=path, version=0, etag=etag_of(stored, size), size=size, chunk_size=size_of_chunks, chunks=stored)


def split(data: Buffer, chunk_size: int) -> list[memoryview]:
    """Zero-copy chunk views of ``data`` (none for empty data)."""
    view = memoryview(data).cast("B")
    return [view[i : i + chunk_size] for i in range(0, len(view), chunk_size)]


@dataclass
class _OpenBlock:
    block_id: str = field(default_factory=new_block_id)
    parts: list[Buffer] = field(default_factory=list)
    size: int = 0


class _Packer:
    """Packs chunk payloads into blocks and writes sealed blocks with bounded parallelism.

    ``add`` returns the ChunkRef at once (the offset is known before the block is written);
    ``durable(block_ids)`` waits until those blocks are in L4.
    """

    def __init__(self, blocks: BlockStore, config: WriteConfig, tasks: asyncio.TaskGroup) -> None:
        self._blocks = blocks
        self._block_size = config.block_size
        self._tasks = tasks
        self._slots = asyncio.Semaphore(config.parallel_blocks)
        self._writes: dict[str, asyncio.Task[None]] = {}
        self._open = _OpenBlock()
        self.bytes_stored = 0

    @property
    def open_block_id(self) -> str:
        return self._open.block_id

    async def add(self, chunk: Encoded) -> ChunkRef:
        if self._open.size and self._open.size + len(chunk.payload) > self._block_size:
            await self.seal()
        block = self._open
        ref = ChunkRef(
            block_id=block.block_id,
            offset=block.size,
            length=len(chunk.payload),
            raw_length=chunk.raw_length,
            checksum=chunk.checksum,
            codec=chunk.codec,  # type: ignore[arg-type]
        )
        block.parts.append(chunk.payload)
        block.size += len(chunk.payload)
        return ref

    async def seal(self) -> None:
        """Start writing the open block (waiting for a free slot: back-pressure)."""
        block, self._open = self._open, _OpenBlock()
        if not block.size:
            return
        await self._slots.acquire()
        self._writes[block.block_id] = self._tasks.create_task(self._write(block))

    async def _write(self, block: _OpenBlock) -> None:
        try:
            await self._blocks.write_block(block.block_id, block.parts)
            self.bytes_stored += block.size
        finally:
            self._slots.release()

    async def durable(self, block_ids: Iterable[str]) -> None:
        pending = [self._writes[b] for b in block_ids]
        if pending:
            await asyncio.gather(*pending)


class Writer:
    """Writes blobs into a BlockStore and commits them to a metadata store (its PlanWriter)."""

    def __init__(self, metadata: PlanWriter, blocks: BlockStore, config: WriteConfig, executor: Executor) -> None:
        check_write_config(config)
        if config.chunk_size > MAX_CHUNK_BYTES:  # every commit would be refused: fail before writing
            raise ValueError(f"chunk_size {config.chunk_size} exceeds the plan limit of {MAX_CHUNK_BYTES} bytes")
        self.metadata = metadata
        self._blocks = blocks
        self._config = config
        self._executor = executor

    @property
    def config(self) -> WriteConfig:
        return self._config

    async def put(self, path: str, data: Buffer, if_version: int | None = None) -> ReadPlan:
        """Write one blob; returns the committed plan.  A commit gc refused (BlockCollected:
        it fenced a block of this write, e.g. behind a skewed clock) is written anew once."""
        validate_writable(path)
        try:
            return await self._put_once(path, data, if_version)
        except BlockCollected:
            return await self._put_once(path, data, if_version)

    async def _put_once(self, path: str, data: Buffer, if_version: int | None) -> ReadPlan:
        async with task_group() as tasks:
            packer = _Packer(self._blocks, self._config, tasks)
            plan = await self._pack(packer, path, data)
            await packer.seal()
            await packer.durable(plan.block_ids())
        self.check_age(plan.block_ids())
        return await self.metadata.commit(path, plan, if_version)

    async def put_many(self, items: Iterable[Item] | AsyncIterable[Item], progress: Progress | None = None) -> list[ReadPlan]:
        """Write many blobs packed into shared blocks.  Blobs are committed in batches as
        their blocks become durable: each blob is atomic, the whole call is not."""
        async with task_group() as tasks:
            packer = _Packer(self._blocks, self._config, tasks)
            batch = _Batch(self, packer, tasks, progress)
            async for item in _aiter(items):
                path, data = _item(item)
                validate_writable(path)
                await batch.add(await self._pack(packer, path, data), memoryview(data).nbytes)
            await batch.finish()
        return batch.committed

    async def write_chunks(self, views: Sequence[memoryview]) -> list[ChunkRef]:
        """Encode ``views`` as chunks (one each), pack them into new blocks and make those
        durable; their refs, in order.  Nothing is committed: the caller commits plans that
        name them (checkpoints mix them with chunks of earlier blocks) before
        ``max_write_seconds`` pass, which :meth:`check_age` of these refs' blocks checks."""
        async with task_group() as tasks:
            packer = _Packer(self._blocks, self._config, tasks)
            refs = [await packer.add(chunk) async for chunk in self._encode(views)]
            await packer.seal()
            await packer.durable({ref.block_id for ref in refs})
        return refs

    async def _pack(self, packer: _Packer, path: str, data: Buffer) -> ReadPlan:
        refs = [await packer.add(chunk) async for chunk in self._encode(split(data, self._config.chunk_size))]
        size = sum(r.raw_length for r in refs)
        return ReadPlan(
            path=path, version=0, etag=etag_of(refs, size), size=size, chunk_size=self._config.chunk_size, chunks=tuple(refs)
        )

    async def _encode(self, views: Sequence[memoryview]) -> AsyncIterator[Encoded]:
        """Encode chunks in order, up to two ahead in the executor (xxhash and lz4 release
        the GIL, so two threads use both cores)."""
        loop = asyncio.get_running_loop()
        compression = self._config.compression
        window: list[asyncio.Future[Encoded]] = []
        for view in views:
            if len(view) < _INLINE_BYTES and not window:
                yield encode_chunk(view, compression)
                continue
            window.append(loop.run_in_executor(self._executor, encode_chunk, view, compression))
            if len(window) > 2:
                yield await window.pop(0)
        for future in window:
            yield await future

    def check_age(self, block_ids: Iterable[str]) -> None:
        oldest = min((block_time(b) for b in block_ids), default=time.time())
        age = time.time() - oldest
        if age > self._config.max_write_seconds:
            raise Unavailable(
                f"write took {age:.3g}s, over max_write_seconds={self._config.max_write_seconds:g}; "
                "not committed (its blocks are left for gc)"
            )


class _Batch:
    """put_many's commits: plans are committed in input order, each batch as soon as every
    block it names is sealed and durable (so a repeated path ends on its last value)."""

    def __init__(self, writer: Writer, packer: _Packer, tasks: asyncio.TaskGroup, progress: Progress | None) -> None:
        self._writer = writer
        self._packer = packer
        self._tasks = tasks
        self._progress = progress
        self._pending: list[tuple[ReadPlan, int]] = []
        self._chain: asyncio.Task[None] | None = None
        self.committed: list[ReadPlan] = []
        self._done = (0, 0)

    async def add(self, plan: ReadPlan, nbytes: int) -> None:
        self._pending.append((plan, nbytes))
        if len(self._pending) >= MAX_BATCH:
            await self._packer.seal()
        ready = self._ready_count()
        if ready:
            self._start_commit(ready)

    async def finish(self) -> None:
        await self._packer.seal()
        self._start_commit(len(self._pending))
        if self._chain is not None:
            await self._chain

    def _ready_count(self) -> int:
        """How many leading pending plans no longer touch the open block."""
        open_id = self._packer.open_block_id
        for i, (plan, _) in enumerate(self._pending):
            if open_id in plan.block_ids():
                return i
        return len(self._pending)

    def _start_commit(self, count: int) -> None:
        batch, self._pending = self._pending[:count], self._pending[count:]
        if batch:
            self._chain = self._tasks.create_task(self._commit(batch, self._chain))

    async def _commit(self, batch: list[tuple[ReadPlan, int]], previous: asyncio.Task[None] | None) -> None:
        block_ids = {b for plan, _ in batch for b in plan.block_ids()}
        await self._packer.durable(block_ids)
        if previous is not None:
            await previous
        self._writer.check_age(block_ids)
        ops = [CommitOp(path=plan.path, plan=plan) for plan, _ in batch]
        self.committed.extend(await self._writer.metadata.commit_many(ops))
        self._done = (self._done[0] + len(batch), self._done[1] + sum(n for _, n in batch))
        if self._progress is not None:
            self._progress(*self._done)


def _item(item: object) -> tuple[Any, Buffer]:
    """An item of put_many: a (path, data) pair whose data is bytes-like (its path is checked next)."""
    path, data = check_pair("put_many: each item", item)
    check_bytes_like(f"put_many: the data of {path!r}", data)
    return path, data


async def _aiter(items: Iterable[Item] | AsyncIterable[Item]) -> AsyncIterator[Item]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
