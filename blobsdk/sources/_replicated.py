"""L4 as N independent replicas behind one BlockStore.

Writes go to every replica at once and return when ``write_quorum`` of them acknowledged
durably: by default a majority (``n // 2 + 1`` of ``n``: 2 of 3, 3 of 5, but 2 of 2 and
1 of 1), so a cluster of three keeps taking writes with one server dead or stopped.  The
slower writes keep running as tasks this store owns (awaited, then cancelled after
``close_timeout``, by :meth:`ReplicatedBlockStore.aclose`), holding at most
``max_lagging_bytes`` of block data (past it the oldest are cancelled).  A block
acknowledged while some replica failed to store it (refused at once, or a lagging write
that failed, timed out or was cancelled later) goes on :attr:`ReplicatedBlockStore.under_replicated`, the list the repairer
works through (blobsdk/ops/repair.py) to make up the missing copies once the replica is back.
That list is in memory: a process that dies first forgets it, and ``blobsdk scrub`` (which
checks every replica of every live block) finds those blocks instead.

**Write-only.**  This store is a :class:`~blobsdk.sources.base.BlockStore` and no
:class:`~blobsdk.sources.base.BlockReplica`: it writes, deletes and lists, and ``replicas``
exposes the copies; it reads nothing.  The one reader of L4 is the replicated read
engine (blobsdk/tail/replicaread.py, the L4 tier's and the L3 node's): it ranks the
replicas (load, latency, health), hedges across them,
verifies every copy and fails over from a bad one, which a plain in-order read here could
not do.  A second reader, unverified and unhedged, would be a second place for a fix to
miss.  (Repair and scrub, blobsdk/ops/repair.py, read each replica on its own, by design:
they judge every copy.)
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any, Literal, Protocol, runtime_checkable

from ..chunks import validate_block_id
from ..errors import ClientClosed, Unavailable, Unreachable
from ..runtime import AsyncResource
from ..wire import BlockInfo
from .base import BlockReplica, BlockStore, Buffer

Quorum = int | Literal["all"] | None  # None: a majority


def majority(replicas: int) -> int:
    """The default write quorum: more than half of ``replicas`` (ceil((n + 1) / 2))."""
    return replicas // 2 + 1


def resolve_quorum(setting: Quorum, replicas: int) -> int:
    """The number of acknowledgements ``setting`` asks of ``replicas``: None is a majority,
    "all" every replica; ValueError unless it is from 1 to ``replicas``."""
    if setting is None:
        return majority(replicas)
    if setting == "all":
        return replicas
    if isinstance(setting, bool) or not isinstance(setting, int) or not 1 <= setting <= replicas:
        raise ValueError(f'write_quorum {setting!r} must be between 1 and {replicas} (the replicas), or "all"')
    return setting


class UnderReplicated:
    """Blocks a write acknowledged without a copy on every replica: the repairer's to-do
    list, oldest first, of at most ``capacity`` ids (one past it is dropped and counted in
    ``dropped``: a scrub finds it).  In memory only (module docstring)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self.recorded = 0
        self.dropped = 0
        self._blocks: dict[str, None] = {}  # insertion-ordered set
        self._changed = asyncio.Event()

    def add(self, block_id: str) -> None:
        if block_id in self._blocks:
            return
        if len(self._blocks) >= self.capacity:
            self.dropped += 1
            return
        self._blocks[block_id] = None
        self.recorded += 1
        self._changed.set()

    def discard(self, block_id: str) -> None:
        self._blocks.pop(block_id, None)

    def blocks(self) -> list[str]:
        """The ids recorded now, oldest first."""
        return list(self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._blocks

    async def wait_for_more(self) -> None:
        """Return once a block was recorded since the last return (at once the first time if
        any was)."""
        await self._changed.wait()
        self._changed.clear()


@runtime_checkable
class RecordsUnderReplicated(Protocol):
    """A block store that records the writes it acknowledged without a copy on every
    replica (ReplicatedBlockStore): a capability the client's repairer is given, whichever
    class has it."""

    @property
    def under_replicated(self) -> UnderReplicated: ...


class ReplicatedBlockStore(AsyncResource):
    """A write-only :class:`~blobsdk.sources.base.BlockStore` over independent replicas (module docstring).

    ``write_quorum`` replicas must acknowledge a write (None, the default: a majority;
    "all": every one); ``close_timeout`` bounds how long :meth:`aclose` waits for writes
    still running past their quorum.  ``noun``: what the replicas are, in errors ("block
    servers").  The store owns its replicas and closes them in :meth:`aclose`.
    """

    def __init__(
        self,
        stores: Sequence[BlockStore],
        write_quorum: Quorum = None,
        *,
        close_timeout: float = 30.0,
        under_replicated: UnderReplicated | None = None,
        max_lagging_bytes: int = 1 << 30,
        noun: str = "replicas",
    ) -> None:
        if not stores:
            raise ValueError("ReplicatedBlockStore needs at least one store")
        self._stores = tuple(stores)
        self._quorum = resolve_quorum(write_quorum, len(self._stores))
        self._close_timeout = close_timeout
        self._writes: set[asyncio.Task[None]] = set()
        self._closed = False
        self.under_replicated = under_replicated if under_replicated is not None else UnderReplicated()
        self._lagging: dict[str, set[asyncio.Task[None]]] = {}  # writes running past their quorum, by block
        self._lagging_sizes: dict[asyncio.Task[None], int] = {}  # the same writes, oldest first: bytes each holds
        self._max_lagging_bytes = max_lagging_bytes
        self._lagging_bytes = 0
        self._noun = noun

    @property
    def name(self) -> str:
        return "replicated[" + ", ".join(s.name for s in self._stores) + "]"

    @property
    def replicas(self) -> tuple[BlockReplica, ...]:
        """Every independent copy, in read order (nested replicated stores are flattened)."""
        return tuple(r for s in self._stores for r in s.replicas)

    @property
    def write_quorum(self) -> int:
        return self._quorum

    async def write_block(self, block_id: str, parts: Sequence[Buffer]) -> None:
        """Write to every replica; return once ``write_quorum`` are durable, else raise
        Unavailable naming each failed replica.  A block acknowledged with a replica that
        failed, or that fails later, is recorded in :attr:`under_replicated`."""
        validate_block_id(block_id)
        self._check_open()
        if self._quorum < len(self._stores):
            parts = _frozen(parts)  # lagging writes read them after we return
        tasks = {self._spawn(s.write_block(block_id, parts)): s for s in self._stores}
        try:
            pending, failed = await self._await_quorum(tasks)
        except BaseException:  # cancelled, or no quorum: the other writes are pointless
            for task in tasks:
                task.cancel()
            raise
        if failed:
            self.under_replicated.add(block_id)
        if pending:
            self._lagging[block_id] = pending
        size = sum(memoryview(p).nbytes for p in parts)
        for task in pending:
            self._lagging_sizes[task] = size
            self._lagging_bytes += size
            task.add_done_callback(partial(self._lagging_done, block_id))
        self._shed_lagging()

    def _shed_lagging(self) -> None:
        """Cancel the oldest writes past their quorum while they hold more than
        ``max_lagging_bytes`` (a stopped server would otherwise pin every block written
        until its timeout): each one cancelled is a missing copy, recorded for repair."""
        for task in list(self._lagging_sizes):
            if self._lagging_bytes <= self._max_lagging_bytes:
                return
            self._lagging_bytes -= self._lagging_sizes.pop(task)
            task.cancel()

    def _lagging_done(self, block_id: str, task: asyncio.Task[None]) -> None:
        """A write still running when its block was acknowledged has ended: if it failed (or
        timed out, or was cancelled by :meth:`aclose`), that replica misses the block."""
        if _error_of(task) is not None:
            self.under_replicated.add(block_id)
        self._lagging_bytes -= self._lagging_sizes.pop(task, 0)
        lagging = self._lagging.get(block_id)
        if lagging is not None:
            lagging.discard(task)
            if not lagging:
                del self._lagging[block_id]

    async def settle(self) -> None:
        """Wait for every write still running past its quorum to end (each is bounded by
        its replica's timeouts); a failed one is in :attr:`under_replicated` by then."""
        tasks = set(self._writes)
        if tasks:
            await asyncio.wait(tasks)

    async def delete_block(self, block_id: str) -> None:
        """Delete on every replica, once the block's writes still running past their quorum
        have ended (so none lands after the delete); Unavailable if any replica failed."""
        validate_block_id(block_id)
        self._check_open()
        if lagging := self._lagging.get(block_id):
            await asyncio.wait(set(lagging))
        results = await asyncio.gather(*(s.delete_block(block_id) for s in self._stores), return_exceptions=True)
        if failed := _failures(self._stores, results):
            raise Unavailable(
                f"delete of block {block_id} failed on {len(failed)} of the {len(self._stores)} {self._noun}: {described(failed)}"
            )

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

    async def _await_quorum(
        self, tasks: dict[asyncio.Task[None], BlockStore]
    ) -> tuple[set[asyncio.Task[None]], list[tuple[str, BaseException]]]:
        """Wait for ``write_quorum`` acknowledgements; (the writes still running, the
        replicas that failed) then, else Unavailable."""
        pending, acked = set(tasks), 0
        failed: list[tuple[str, BaseException]] = []
        while acked < self._quorum:
            if len(failed) > len(tasks) - self._quorum:
                raise Unavailable(
                    f"a write needs {self._quorum} of the {len(tasks)} {self._noun} and {len(failed)} failed: {described(failed)}"
                )
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = _error_of(task)
                acked += error is None
                failed += [] if error is None else [(tasks[task].name, error)]
        return pending, failed

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


def _error_of(task: asyncio.Task[None]) -> BaseException | None:
    """None if the write succeeded, else why it failed (a CancelledError if it was cancelled)."""
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()


def _failures(stores: Sequence[BlockStore], results: Sequence[object]) -> list[tuple[str, BaseException]]:
    failed: list[tuple[str, BaseException]] = []
    for store, result in zip(stores, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # KeyboardInterrupt and friends are not a replica's failure
        if isinstance(result, Exception):
            failed.append((store.name, result))
    return failed


def described(failed: Sequence[tuple[str, BaseException]]) -> str:
    """Why replicas failed, in short: those nothing answered at grouped by why ("connection
    refused at A, B (nothing listens there: ...)"), each other one as "NAME: ERROR"."""
    unreached: dict[tuple[str, str], list[str]] = {}
    others: list[str] = []
    for name, exc in failed:
        if isinstance(exc, Unreachable) and exc.address:
            unreached.setdefault((exc.reason, exc.hint), []).append(exc.address)
        else:
            why = "cancelled" if isinstance(exc, asyncio.CancelledError) else f"{type(exc).__name__}: {exc}"
            others.append(f"{name}: {why}")
    groups = [f"{reason} at {', '.join(addresses)} ({hint})" for (reason, hint), addresses in unreached.items()]
    return "; ".join(groups + others)


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
