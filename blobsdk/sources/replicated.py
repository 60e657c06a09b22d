"""L4 as N independent replicas behind one BlockStore.

Writes go to every replica at once and return when ``write_quorum`` of them acknowledged
durably; the slower writes keep running as tasks this store owns (awaited, then cancelled
after ``close_timeout``, by :meth:`ReplicatedBlockStore.aclose`).  Reads try the replicas
in order and fail over on any error about a replica.  This store does not verify bytes:
``replicas`` exposes the copies so the read path can check each answer and fail over.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing
from typing import Any, Self, TypeVar

from ..errors import (
    BlobError,
    BlockNotFound,
    ClientClosed,
    CorruptData,
    Unauthorized,
    Unavailable,
)
from ..hedge import Attempt
from ..wire import BlockInfo
from .base import BlockStore, Buffer, validate_block_id

T = TypeVar("T")

# When every replica failed the same way, that error says more than "Unavailable".
_UNANIMOUS = (BlockNotFound, CorruptData, Unauthorized)


class ReplicatedBlockStore:
    """A :class:`~blobsdk.sources.base.BlockStore` over independent replicas.

    ``write_quorum`` (default: all) replicas must acknowledge a write; ``close_timeout``
    bounds how long :meth:`aclose` waits for writes still running past their quorum.
    The store owns its replicas and closes them in :meth:`aclose`.
    """

    def __init__(self, stores: Sequence[BlockStore], write_quorum: int | None = None, *, close_timeout: float = 30.0) -> None:
        if not stores:
            raise ValueError("ReplicatedBlockStore needs at least one store")
        self._stores = tuple(stores)
        self._quorum = len(self._stores) if write_quorum is None else write_quorum
        if not 1 <= self._quorum <= len(self._stores):
            raise ValueError(f"write_quorum {write_quorum} must be between 1 and {len(self._stores)} (the replicas)")
        self._close_timeout = close_timeout
        self._writes: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def name(self) -> str:
        return "replicated[" + ", ".join(s.name for s in self._stores) + "]"

    @property
    def replicas(self) -> tuple[BlockStore, ...]:
        """Every independent copy, in read order (nested replicated stores are flattened)."""
        return tuple(r for s in self._stores for r in s.replicas)

    @property
    def write_quorum(self) -> int:
        return self._quorum

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        """Write to every replica; return once ``write_quorum`` are durable, else raise
        Unavailable naming each failed replica."""
        validate_block_id(block_id)
        self._check_open()
        if self._quorum < len(self._stores):
            parts = _frozen(parts)  # lagging writes read them after we return
        tasks = {self._spawn(s.write_block(block_id, parts)): s for s in self._stores}
        try:
            await self._await_quorum(block_id, tasks)
        except BaseException:  # cancelled, or no quorum: the other writes are pointless
            for task in tasks:
                task.cancel()
            raise

    async def read_into(
        self, block_id: str, offset: int, out: memoryview, *, attempt: Attempt | None = None, grant: str = ""
    ) -> None:
        await self._first_answer(block_id, lambda s: s.read_into(block_id, offset, out, attempt=attempt, grant=grant))

    async def read_range(self, block_id: str, offset: int, length: int) -> bytes:
        return await self._first_answer(block_id, lambda s: s.read_range(block_id, offset, length))

    async def delete_block(self, block_id: str) -> None:
        """Delete on every replica; Unavailable if any of them failed."""
        validate_block_id(block_id)
        self._check_open()
        results = await asyncio.gather(*(s.delete_block(block_id) for s in self._stores), return_exceptions=True)
        failed = _failures(self._stores, results)
        if failed:
            raise Unavailable(f"delete of block {block_id} failed on {len(failed)} replica(s): {'; '.join(failed)}")

    async def list_blocks(self) -> AsyncIterator[BlockInfo]:
        """The union of every replica's blocks, sorted and deduplicated.  A lazy k-way
        merge (each replica already yields sorted ids): memory stays O(replicas), and a
        replica that cannot list fails the listing rather than silently shrinking it."""
        listings = [s.list_blocks() for s in self._stores]
        try:
            async with aclosing(_merge_unique(listings)) as merged:
                async for info in merged:
                    yield info
        finally:
            for listing in listings:
                aclose = getattr(listing, "aclose", None)  # the protocol promises only __anext__
                if aclose is not None:
                    await aclose()

    async def aclose(self) -> None:
        """Wait up to ``close_timeout`` for writes still running, cancel the rest, then
        close every replica.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._drain_writes()
        for store in self._stores:
            await store.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"block store {self.name} is closed")

    def _spawn(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failure past the quorum is not an unhandled error

    async def _await_quorum(self, block_id: str, tasks: dict[asyncio.Task[None], BlockStore]) -> None:
        pending, acked = set(tasks), 0
        failed: list[str] = []
        while acked < self._quorum:
            if len(failed) > len(tasks) - self._quorum:
                raise Unavailable(
                    f"block {block_id}: {acked} of the {self._quorum} acknowledgements needed, "
                    f"{len(failed)} replica(s) failed: {'; '.join(failed)}"
                )
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = _outcome(task)
                acked += error is None
                failed += [] if error is None else [f"{tasks[task].name}: {error}"]

    async def _drain_writes(self) -> None:
        tasks = set(self._writes)
        if not tasks:
            return
        try:
            await asyncio.wait(tasks, timeout=self._close_timeout)
        finally:
            for task in tasks:
                task.cancel()  # no-op for the finished ones
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _first_answer(self, block_id: str, op: Callable[[BlockStore], Awaitable[T]]) -> T:
        """``op`` on each replica in order until one answers.  ValueError (a bad request,
        BadRequest included) is the caller's fault and is raised at once."""
        validate_block_id(block_id)
        self._check_open()
        errors: list[tuple[BlockStore, BlobError]] = []
        for store in self._stores:
            try:
                return await op(store)
            except ValueError:
                raise
            except BlobError as exc:
                errors.append((store, exc))
        raise _read_failure(block_id, errors)


def _outcome(task: asyncio.Task[None]) -> str | None:
    """None if the write succeeded, else why it failed."""
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def _failures(stores: Sequence[BlockStore], results: Sequence[object]) -> list[str]:
    failed = []
    for store, result in zip(stores, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # KeyboardInterrupt and friends are not a replica's failure
        if isinstance(result, Exception):
            failed.append(f"{store.name}: {type(result).__name__}: {result}")
    return failed


def _read_failure(block_id: str, errors: list[tuple[BlockStore, BlobError]]) -> BlobError:
    detail = "; ".join(f"{s.name}: {type(e).__name__}: {e}" for s, e in errors)
    kind = type(errors[0][1])
    if kind in _UNANIMOUS and all(type(e) is kind for _, e in errors):
        return kind(f"block {block_id}: every replica failed the same way: {detail}")
    return Unavailable(f"block {block_id}: no replica could answer: {detail}")


def _frozen(parts: Sequence[Buffer]) -> tuple[Buffer, ...]:
    """``parts`` as immutable buffers: a copy of each mutable one, so the caller may reuse
    its buffers once write_block returns even though slower replicas still read them."""
    return tuple(p if _immutable(p) else bytes(p) for p in parts)


def _immutable(part: Buffer) -> bool:
    return isinstance(part, bytes) or (isinstance(part, memoryview) and isinstance(part.obj, bytes))


async def _merge_unique(listings: list[AsyncIterator[BlockInfo]]) -> AsyncGenerator[BlockInfo, None]:
    heap: list[tuple[str, int, BlockInfo]] = []
    for i, listing in enumerate(listings):
        await _push_next(heap, i, listing)
    last = None
    while heap:
        block_id, i, info = heapq.heappop(heap)
        if block_id != last:
            yield info
            last = block_id
        await _push_next(heap, i, listings[i])


async def _push_next(heap: list[tuple[str, int, BlockInfo]], i: int, listing: AsyncIterator[BlockInfo]) -> None:
    info = await anext(listing, None)
    if info is not None:
        heapq.heappush(heap, (info.block_id, i, info))
